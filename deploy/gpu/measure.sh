#!/usr/bin/env bash
# The request path measured ON the GPU machine, in one call (docs/GPU.md, "The request path measured
# there"): the figures issue 14 asks of a 16-core host and issue 17 asks of the GPU machine.
#   here:  bash deploy/gpu/bundle.sh            (the wheels and .whl/perf_analyzer.tar.xz)
#   there: device run, carry [".whl"], timeout_s 600, command "bash deploy/gpu/measure.sh"
# Conveyor alone (real Triton does not travel: its build is 370 MiB): the ZeroMQ chain's floor
# (deploy/benchmarks/transport.py) and vs_triton.py --no-triton over the issue's five cases at
# c=1, 4, 16 and 64, one pass, into $OUT/measure-report.md. Every step is bounded; the whole stays
# under MEASURE_BUDGET_S (540). It may follow check.sh on the same warm machine or run alone.
#
# MEASURE_STEPS picks the steps (default "transport vs_triton batching"; batching needs the GPU: a
# TorchScript MLP on cuda:0 under dynamic batching, deploy/gpu/batching.py).
#
# Without a GPU machine, to prove the script: PYTHON=.venv/bin/python CHECK_LOCAL=1 MEASURE_QUICK=1
# MEASURE_STEPS="transport vs_triton" bash deploy/gpu/measure.sh (this environment's packages and
# perf_analyzer, two cases, c=1 and 4).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
PY=${PYTHON:-python3}
LOCAL=${CHECK_LOCAL:-0}
QUICK=${MEASURE_QUICK:-0}
BUDGET=${MEASURE_BUDGET_S:-540}
STEPS=" ${MEASURE_STEPS:-transport vs_triton batching} "
OUT=${OUT:-$(mktemp -d /tmp/conveyor-gpu-measure.XXXXXX)}
START=$(date +%s)
SETUP=$OUT/measure-setup.log  # beside check.sh's setup.log when both write to one $OUT
mkdir -p "$OUT"
: > "$SETUP"
export PYTHONUNBUFFERED=1
FAILED=0

row() { echo "[$2] $1: $3" | tee -a "$SETUP"; [ "$2" = FAIL ] && FAILED=1; return 0; }

# 1. The bundle and conveyor.* (the check's own steps), unless this warm machine has them already.
# shellcheck source=deploy/gpu/site.sh
source deploy/gpu/site.sh
if [ "$LOCAL" != 1 ] && [ -d "$SITE" ] && [ -d "$LINKS" ]; then
  export PYTHONPATH=$SITE:$LINKS${PYTHONPATH:+:$PYTHONPATH}
  row "install the bundle" PASS "already in $SITE (check.sh ran first)"
else
  install_site
fi

# 2. perf_analyzer: here the installed one; there the bundle's, with the two libraries it needs.
if [ "$LOCAL" = 1 ]; then
  PA=${PERF_ANALYZER:-$REPO/.cache/perf_analyzer/perf_analyzer}
else
  PA_DIR=/tmp/conveyor-perf-analyzer
  rm -rf "$PA_DIR" && mkdir -p "$PA_DIR"
  tar -C "$PA_DIR" -xJf .whl/perf_analyzer.tar.xz >> "$SETUP" 2>&1 \
    || row "perf_analyzer unpacked" FAIL "no .whl/perf_analyzer.tar.xz: run 'bash deploy/gpu/bundle.sh' here"
  cat > "$PA_DIR/perf_analyzer" <<SH
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$PA_DIR/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$PA_DIR/perf_analyzer.bin" "\$@"
SH
  chmod +x "$PA_DIR/perf_analyzer"
  PA=$PA_DIR/perf_analyzer
fi
if out=$(timeout 30 "$PA" --version 2>&1); then
  row "perf_analyzer" PASS "$(echo "$out" | tail -1)"
else
  row "perf_analyzer" FAIL "$(echo "$out" | tail -1)"
fi

# 3. The command vs_triton.py starts: <checkout>/.venv/bin/conveyor. There, a wrapper over this Python
# (PYTHONPATH, with the bundle and the link tree, is inherited).
if [ ! -x .venv/bin/conveyor ]; then
  mkdir -p .venv/bin
  printf '#!/usr/bin/env bash\nexec %q -m conveyor.deploy.cli "$@"\n' "$PY" > .venv/bin/conveyor
  chmod +x .venv/bin/conveyor
fi

# 4. The chain's floor: a request's three hops with no work in them (and the router off the way).
rounds=3000
[ "$QUICK" = 1 ] && rounds=1000
if [[ $STEPS != *" transport "* ]]; then
  :
elif timeout -k 5 "$(cap 90 300)" "$PY" -m conveyor.deploy.benchmarks.transport --round-trips "$rounds" --repeat 2 \
     --out "$OUT" > "$OUT/transport.log" 2>&1; then
  row "transport (the chain's floor)" PASS "$OUT/transport.md"
else
  row "transport (the chain's floor)" FAIL "rc $? (transport.log)"
fi

# 5. The issue's cases, Conveyor alone, each server started afresh.
cases=(1 2 3 4 5)
conc=(1 4 16 64)
seconds=3
if [ "$QUICK" = 1 ]; then cases=(1 2); conc=(1 4); seconds=2; fi
t0=$(date +%s)
if [[ $STEPS != *" vs_triton "* ]]; then
  :
elif timeout -k 10 "$(cap 420 100)" "$PY" -m conveyor.deploy.benchmarks.vs_triton --no-triton --cases "${cases[@]}" \
     --concurrency "${conc[@]}" --passes 1 --seconds "$seconds" --perf-analyzer "$PA" --out "$OUT" \
     > "$OUT/vs_triton.log" 2>&1; then
  row "vs_triton.py --no-triton (cases ${cases[*]}, c=${conc[*]})" PASS "$(( $(date +%s) - t0 )) s"
else
  row "vs_triton.py --no-triton (cases ${cases[*]}, c=${conc[*]})" FAIL "rc $? after $(( $(date +%s) - t0 )) s (vs_triton.log)"
fi

# 6. Dynamic batching on the GPU: a TorchScript model heavy enough to keep it busy.
t0=$(date +%s)
if [[ $STEPS != *" batching "* ]]; then
  :
elif timeout -k 10 "$(cap 150 10)" "$PY" deploy/gpu/batching.py --perf-analyzer "$PA" --out "$OUT" \
     > "$OUT/batching.log" 2>&1; then
  row "batching.py (TorchScript on cuda:0, dynamic batching)" PASS "$(( $(date +%s) - t0 )) s"
else
  row "batching.py (TorchScript on cuda:0, dynamic batching)" FAIL "rc $? after $(( $(date +%s) - t0 )) s (batching.log)"
fi

# 7. The report.
{
  echo "# Conveyor on the GPU machine: the request path measured"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(elapsed) s; commit $(git rev-parse --short HEAD 2>/dev/null || echo '?');" \
       "$(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); load average at the end" \
       "$(cut -d' ' -f1-3 /proc/loadavg)."
  echo
  echo "## Steps"
  echo
  grep '^\[' "$SETUP"
  echo
  echo "## The chain's floor (deploy/benchmarks/transport.py)"
  echo
  cat "$OUT/transport.md" 2>/dev/null || echo "(none)"
  echo
  echo "## Conveyor alone (deploy/benchmarks/vs_triton.py --no-triton)"
  echo
  cat "$OUT/vs_triton.md" 2>/dev/null || { echo "(none; the end of vs_triton.log:)"; tail -20 "$OUT/vs_triton.log" 2>/dev/null; }
  echo
  echo "## Dynamic batching on the GPU (deploy/gpu/batching.py)"
  echo
  cat "$OUT/batching.md" 2>/dev/null || { echo "(none; the end of batching.log:)"; tail -20 "$OUT/batching.log" 2>/dev/null; }
} > "$OUT/measure-report.md"
echo
echo "report: $OUT/measure-report.md ($(elapsed) s)"
[ "$FAILED" = 0 ]
