#!/usr/bin/env bash
# The GPU check, run ON the device machine as one command (docs/GPU.md, "The GPU check in one call"):
#   here:  bash deploy/gpu/bundle.sh            (the wheels the machine lacks, into .whl/)
#   there: device run, carry [".whl"], command "bash deploy/gpu/check.sh"
# It installs .whl/ into /tmp/conveyor-site (no index, no deps), maps conveyor.* onto this tree with a
# link tree (no editable install there), prints the GPU and the versions, runs the GPU tests
# (pytest -m gpu, per-test timeout) and the end-to-end check (deploy/gpu/e2e.py: a real group on the GPU
# driven by tritonclient), and writes $OUT/gpu-report.md with PASS/FAIL per item, plus its logs.
# Exit status 1 when any item FAILed. Every step is bounded; the whole stays under CHECK_BUDGET_S (540).
#
# Without a GPU (a developer's machine): CHECK_LOCAL=1 uses this environment's packages instead of .whl
# (whose cp312 wheels need Python 3.12) and runs the end-to-end check dry; OUT defaults to a temp dir.
#   PYTHON=.venv/bin/python CHECK_LOCAL=1 bash deploy/gpu/check.sh
# CHECK_DRY=1 alone installs the bundle and runs dry: with a Python 3.12 that has the machine's base
# packages, it proves the bundle without a GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
PY=${PYTHON:-python3}
LOCAL=${CHECK_LOCAL:-0}
DRY=${CHECK_DRY:-$LOCAL}  # 1: no GPU expected, the end-to-end check runs dry
BUDGET=${CHECK_BUDGET_S:-540}
OUT=${OUT:-$(mktemp -d /tmp/conveyor-gpu-check.XXXXXX)}
START=$(date +%s)
WORK=$(mktemp -d)
ROWS=$WORK/rows.md
ENVMD=$WORK/env.md
SETUP=$OUT/setup.log
mkdir -p "$OUT"
: > "$ROWS"
: > "$SETUP"
export PYTHONUNBUFFERED=1

row() { printf '| %s | %s | %s |\n' "$1" "$2" "${3//|/\\|}" >> "$ROWS"; echo "[$2] $1: $3"; }

# 1-2. The bundle installed, conveyor.* mapped onto this tree (deploy/gpu/site.sh).
# shellcheck source=deploy/gpu/site.sh
source deploy/gpu/site.sh
install_site

# 3. The machine, and what this check runs on.
{ echo "== nvidia-smi"; timeout 30 nvidia-smi 2>&1; echo "== pip list"; timeout 60 "$PY" -m pip list 2>&1; } >> "$SETUP"
timeout 90 "$PY" - > "$ENVMD" 2>> "$SETUP" <<'PYEOF'
import importlib, importlib.metadata, platform, subprocess, sys
def v(name, extra=lambda m: "", dist=None):
    try:
        m = importlib.import_module(name)
        try:
            version = importlib.metadata.version(dist or name)
        except Exception:
            version = getattr(m, "__version__", "")
        return f"{version} {extra(m)}".strip()
    except Exception as exc:
        return f"missing ({type(exc).__name__}: {str(exc)[:120]})"
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20).stdout.strip() or "none"
except Exception as exc:
    gpu = f"none ({type(exc).__name__})"
print(f"- GPU: {gpu}")
print(f"- Python {platform.python_version()} ({sys.executable}), {platform.machine()}")
print("- torch:", v("torch", lambda m: f"CUDA {m.version.cuda}, available {m.cuda.is_available()}"
                    + (f", {m.cuda.get_device_name(0)}" if m.cuda.is_available() else "")))
print("- cupy:", v("cupy", lambda m: f"devices {m.cuda.runtime.getDeviceCount()}", "cupy-cuda13x"))
print("- pynvml:", v("pynvml", dist="nvidia-ml-py"))
print("- cuda.bindings:", v("cuda.bindings", dist="cuda-bindings"))
print("- onnxruntime:", v("onnxruntime", lambda m: f"providers {m.get_available_providers()}"))
print("- tensorrt:", v("tensorrt"))
for name, dist in (("tritonclient", None), ("grpc", "grpcio"), ("google.protobuf", "protobuf"), ("zmq", "pyzmq"),
                   ("msgspec", None), ("falcon", None), ("uvicorn", None), ("numpy", None), ("pytest", None)):
    print(f"- {name}:", v(name, dist=dist))
try:
    print("- conveyor from:", importlib.import_module("conveyor.proto").__file__)
except Exception as exc:
    print("- conveyor: not importable:", exc)
PYEOF
cat "$ENVMD"

# 4. Everything a group and the tests import.
if out=$(timeout 120 "$PY" -c "
import conveyor.deploy.cli, conveyor.router.server, conveyor.workers.worker, conveyor.ingress.http.server
import conveyor.ingress.grpc, conveyor.workers.backends.pytorch.backend, conveyor.workers.client_regions
import tritonclient.http, tritonclient.grpc, uvloop, httptools, posix_ipc
print(conveyor.deploy.cli.__file__)" 2>&1); then
  row "imports (conveyor.* through the link tree, tritonclient, uvloop, httptools)" PASS "${out##*$'\n'}"
else
  row "imports (conveyor.* through the link tree, tritonclient, uvloop, httptools)" FAIL "$(echo "$out" | tail -1)"
fi
if out=$(timeout 120 "$PY" -c "import tritonclient.utils.cuda_shared_memory" 2>&1); then
  row "tritonclient.utils.cuda_shared_memory imports (cuda.bindings)" PASS ""
else
  row "tritonclient.utils.cuda_shared_memory imports (cuda.bindings)" FAIL "$(echo "$out" | tail -1)"
fi

# 5. The GPU tests. Only the files that hold them: the others import what only CI installs.
mapfile -t files < <(grep -rl --include="test_*.py" "pytest.mark.gpu" tests | sort)
t0=$(date +%s)
timeout -k 10 "$(cap 240 110)" "$PY" -m pytest -m gpu -v -rA -p no:cacheprovider --timeout 150 \
  --junitxml "$OUT/pytest-junit.xml" "${files[@]}" > "$OUT/pytest.log" 2>&1
rc=$?
summary=$(grep -E "^=+ .*(passed|failed|skipped|error|no tests).* in " "$OUT/pytest.log" | tail -1 | tr -d '=' | xargs)
case $rc in
  0) row "pytest -m gpu (${#files[@]} files)" PASS "${summary:-rc 0} ($(( $(date +%s) - t0 )) s)" ;;
  124|137) row "pytest -m gpu (${#files[@]} files)" FAIL "timed out after $(( $(date +%s) - t0 )) s (pytest.log)" ;;
  *) row "pytest -m gpu (${#files[@]} files)" FAIL "rc $rc: ${summary:-see pytest.log}" ;;
esac
[ -s "$OUT/pytest-junit.xml" ] && "$PY" deploy/gpu/junit_rows.py "$OUT/pytest-junit.xml" >> "$ROWS"

# 6. End to end: a real group on the GPU, tritonclient over HTTP and gRPC, CUDA shm, /metrics.
dry=()
[ "$DRY" = 1 ] && dry=(--dry)
t0=$(date +%s)
timeout -k 10 "$(cap 240 10)" "$PY" deploy/gpu/e2e.py --rows "$WORK/e2e.md" --log "$OUT/e2e-server.log" "${dry[@]}" \
  > "$OUT/e2e.log" 2>&1
rc=$?
cat "$OUT/e2e.log"
[ -s "$WORK/e2e.md" ] && cat "$WORK/e2e.md" >> "$ROWS"
case $rc in
  0) row "end-to-end check (deploy/gpu/e2e.py)" PASS "$(( $(date +%s) - t0 )) s" ;;
  124|137) row "end-to-end check (deploy/gpu/e2e.py)" FAIL "timed out after $(( $(date +%s) - t0 )) s (e2e.log)" ;;
  *) row "end-to-end check (deploy/gpu/e2e.py)" FAIL "rc $rc (e2e.log, e2e-server.log)" ;;
esac

# 6b. The CPU frameworks on that machine's cores (a smoke run): FIL's and OpenVINO's own tests (tiny
# models built on the fly, real groups, tritonclient), from .whl/frameworks/ (bundle.sh). TensorFlow's
# wheel does not travel: its tests report SKIP.
if [ -d .whl/frameworks ] || [ "$LOCAL" = 1 ]; then
  if [ "$LOCAL" != 1 ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
      --target "$SITE" --upgrade .whl/frameworks/*.whl >> "$SETUP" 2>&1 \
      && tar -C "$SITE" -xJf .whl/frameworks/openvino-cpu.tar.xz >> "$SETUP" 2>&1 \
      || row "frameworks installed (.whl/frameworks)" FAIL "see setup.log"
  fi
  t0=$(date +%s)
  timeout -k 10 "$(cap 180 70)" "$PY" -m pytest -v -rA -p no:cacheprovider --timeout 150 \
    --junitxml "$WORK/frameworks-junit.xml" tests/workers/backends/fil tests/workers/backends/openvino \
    tests/workers/backends/tensorflow > "$OUT/frameworks.log" 2>&1
  rc=$?
  summary=$(grep -E "^=+ .*(passed|failed|skipped|error|no tests).* in " "$OUT/frameworks.log" | tail -1 | tr -d '=' | xargs)
  case $rc in
    0) row "FIL, OpenVINO, TensorFlow tests on the CPU ($(nproc) cores)" PASS "${summary:-rc 0} ($(( $(date +%s) - t0 )) s)" ;;
    124|137) row "FIL, OpenVINO, TensorFlow tests on the CPU" FAIL "timed out after $(( $(date +%s) - t0 )) s (frameworks.log)" ;;
    *) row "FIL, OpenVINO, TensorFlow tests on the CPU" FAIL "rc $rc: ${summary:-see frameworks.log}" ;;
  esac
  [ -s "$WORK/frameworks-junit.xml" ] && "$PY" deploy/gpu/junit_rows.py "$WORK/frameworks-junit.xml" \
    | grep -v " | PASS | " >> "$ROWS"  # the failures and skips, one row each
else
  row "FIL, OpenVINO, TensorFlow tests on the CPU" SKIP "no .whl/frameworks: run 'bash deploy/gpu/bundle.sh' here"
fi

# 7. The report.
count() { grep -c -F " | $1 | " "$ROWS"; }
n_pass=$(count PASS); n_fail=$(count FAIL); n_skip=$(count SKIP); n_gap=$(count GAP)
verdict=PASS
[ "$n_fail" -gt 0 ] && verdict=FAIL
{
  echo "# Conveyor GPU check: $verdict"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(elapsed) s; $n_pass PASS, $n_fail FAIL, $n_skip SKIP, $n_gap GAP" \
       "(GAP: a known difference from Triton, not a failure)$([ "$DRY" = 1 ] && echo '; dry run (CHECK_DRY=1): no GPU expected')."
  echo "Commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git status --porcelain 2>/dev/null | grep -qv '^??' && echo ' (with changes)')."
  echo
  echo "## Machine"
  echo
  cat "$ENVMD"
  echo
  echo "## Items"
  echo
  echo "| item | status | detail |"
  echo "|---|---|---|"
  cat "$ROWS"
  echo
  echo "Files beside this report: setup.log (nvidia-smi, pip list, install), pytest.log, pytest-junit.xml," \
       "e2e.log, e2e-server.log (the group's own log), frameworks.log."
} > "$OUT/gpu-report.md"
rm -rf "$WORK"
echo
echo "report: $OUT/gpu-report.md ($verdict in $(elapsed) s)"
[ "$verdict" = PASS ]
