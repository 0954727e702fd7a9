#!/bin/bash
# Run triton-inference-server/vllm_backend's own CI (ci/) against Conveyor's `tritonserver`, its test.sh and
# test files unchanged (see docs/COMPATIBILITY.md and docs/LLM.md).
#
#   deploy/vllm_backend_ci.sh VLLM_BACKEND_CHECKOUT PYTHON_BACKEND_CHECKOUT [WORK_DIR [SUITE...]]
#
# SUITE: L0_backend_vllm/accuracy_test, L0_backend_vllm/request_cancellation, L0_backend_vllm/enabled_stream,
# L0_backend_vllm/vllm_backend, L0_backend_vllm/metrics_test, L0_check_health_vllm, L0_additional_outputs_vllm;
# or all (the default). Each runs as vllm_backend's CI runs it (`bash -ex test.sh` in its folder, with the
# repository that test.sh builds from samples/model_repository), and prints its tests run and passed.
#
# VLLM_BACKEND_CHECKOUT: a checkout (or `git archive`) of triton-inference-server/vllm_backend;
# PYTHON_BACKEND_CHECKOUT: one of triton-inference-server/python_backend, whose examples/add_sub the
# vllm_backend suite downloads with wget (a stand-in wget copies it from there). ci/ and samples/ are copied
# into WORK_DIR, where the tests find each other by relative paths and write their logs.
#
# The models they download (facebook/opt-125m) are a tiny Llama made on the fly (tests/support/tiny_llama.py's
# build_standin: a word-level vocabulary, plausible greedy text), put where vLLM looks for them: an offline
# Hugging Face cache (HF_HOME=WORK_DIR/hf, HF_HUB_OFFLINE=1). Servers and tests run in a network namespace of
# their own (`unshare -rn`: the suites use the fixed ports 8000-8002, and nothing is downloaded), with the
# engine's CPU KV cache at VLLM_CPU_KVCACHE_SPACE GiB (default 1: several engines share a small host).
#
# L0_check_health_vllm also runs in a mount namespace of its own (`unshare -m`), where vLLM's package is an
# overlay of this environment's (its changes go to WORK_DIR/overlay and are seen only there), and where Triton's
# container path to it, /usr/local/lib/python3.12/dist-packages/vllm, leads to it: its test.sh mocks vLLM's
# check_health() by editing that path's v1/engine/async_llm.py, and the servers it starts then run the mock.
# (Only that suite: a server's start kills what a killed server of its group left running only in its own
# mount namespace, lifeline.kill_orphans.)
#
# TRITONSERVER (default: the tritonserver beside $PYTHON, running this checkout's build/src) is the server
# command. Needs the vllm extra and
# pytest, tritonclient[grpc], jq and curl; a kernel that mounts overlayfs in a user namespace (Linux 5.11+).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
VB=$(realpath "$1")
PYBACKEND=$(realpath "$2")
WORK=$(realpath -m "${3:-$(mktemp -d)}")
shift $(( $# < 3 ? $# : 3 ))
SUITES=("$@")
ALL=(L0_backend_vllm/accuracy_test L0_backend_vllm/request_cancellation L0_backend_vllm/enabled_stream
     L0_backend_vllm/vllm_backend L0_backend_vllm/metrics_test L0_check_health_vllm L0_additional_outputs_vllm)
[ ${#SUITES[@]} -eq 0 ] && SUITES=(all)
[ "${SUITES[0]}" = all ] && SUITES=("${ALL[@]}")
PY=${PYTHON:-python}
case $PY in /*) ;; */*) PY=$PWD/$PY ;; *) PY=$(command -v "$PY") ;; esac
SERVER=${TRITONSERVER:-$(dirname "$PY")/tritonserver}
case $SERVER in /*) ;; */*) SERVER=$PWD/$SERVER ;; esac

mkdir -p "$WORK/logs"
rm -rf "$WORK/ci" "$WORK/samples"
cp -r "$VB/ci" "$VB/samples" "$WORK/"

# The stand-in, as the Hugging Face cache holds facebook/opt-125m.
PYTHONPATH="$HERE/build/src:$HERE${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$WORK" <<'EOF'
import sys
from pathlib import Path

from tests.support import tiny_llama

work = Path(sys.argv[1])
model = tiny_llama.build_standin(work / "standin")
tiny_llama.standin_cache(work / "hf", "facebook/opt-125m", model)
EOF

# Triton's layout: TRITON_DIR/bin/tritonserver and TRITON_DIR/backends (--backend-directory, which Conveyor takes).
mkdir -p "$WORK/triton/bin" "$WORK/triton/backends" "$WORK/bin"
ln -sf "$SERVER" "$WORK/triton/bin/tritonserver"
# wget: the add_sub example from the local python_backend checkout. pip3: the suites' installs, already here.
# python3: $PYTHON's (its folder first on PATH: a virtual environment's).
cat > "$WORK/bin/wget" <<EOF
#!/bin/bash
dir=.
while [ \$# -gt 1 ]; do [ "\$1" = -P ] && { dir=\$2; shift; }; shift; done
mkdir -p "\$dir" && cp "$PYBACKEND/examples/add_sub/\$(basename "\$1")" "\$dir/"
EOF
printf '#!/bin/sh\necho "pip3 $*: provided by the environment"\n' > "$WORK/bin/pip3"
chmod +x "$WORK/bin/wget" "$WORK/bin/pip3"

# Run in the suites' namespaces (as their root): vLLM's package writable through an overlay, and at Triton's path.
VLLM_DIR=$("$PY" -c 'import importlib.util as u, os; print(os.path.realpath(u.find_spec("vllm").submodule_search_locations[0]))')
TRITON_VLLM=/usr/local/lib/python3.12/dist-packages/vllm  # L0_check_health_vllm's VLLM_INSTALL_PATH
cat > "$WORK/bin/vllm-overlay" <<EOF
#!/bin/bash
set -e
ov="$WORK/overlay"
rm -rf "\$ov" && mkdir -p "\$ov/vllm/upper" "\$ov/vllm/work" "\$ov/lib/upper" "\$ov/lib/work"
mount -t overlay overlay -o "lowerdir=$VLLM_DIR,upperdir=\$ov/vllm/upper,workdir=\$ov/vllm/work" "$VLLM_DIR"
if [ "\$(realpath -m "$TRITON_VLLM")" != "$VLLM_DIR" ]; then
    mkdir -p "\$ov/lib/upper/python3.12/dist-packages"
    ln -s "$VLLM_DIR" "\$ov/lib/upper/python3.12/dist-packages/vllm"
    mount -t overlay overlay -o "lowerdir=/usr/local/lib,upperdir=\$ov/lib/upper,workdir=\$ov/lib/work" /usr/local/lib
fi
EOF
chmod +x "$WORK/bin/vllm-overlay"

# count LOG: "run passed" of one unittest (-v) or pytest (-v) log.
count() {
    local log=$1
    [ -f "$log" ] || { echo "0 0"; return; }
    if grep -qE '^Ran [0-9]+ test' "$log"; then
        local ran failed
        ran=$(grep -oE '^Ran [0-9]+' "$log" | awk '{s+=$2} END {print s+0}')
        failed=$(grep -cE '^(FAIL|ERROR): ' "$log" || true)
        echo "$ran $((ran - failed))"
    else
        local passed failed
        passed=$(grep -cE ' PASSED' "$log" || true)
        failed=$(grep -cE ' (FAILED|ERROR)' "$log" || true)
        echo "$((passed + failed)) $passed"
    fi
}

for suite in "${SUITES[@]}"; do
    dir=$WORK/ci/$suite
    out=$WORK/logs/${suite//\//.}.log  # outside the folder: L0_check_health_vllm's test.sh removes its *.log
    [ -d "$dir" ] || { echo "unknown suite: $suite" >&2; exit 2; }
    echo "=== $suite"
    rc=0 ns=-rn overlay=:
    [ "$suite" = L0_check_health_vllm ] && ns=-rmn overlay=vllm-overlay
    (cd "$dir" && unshare $ns env PATH="$WORK/bin:$(dirname "$PY"):$PATH" TRITON_DIR="$WORK/triton" SERVER="$WORK/triton/bin/tritonserver" \
        PYTHONPATH="$HERE/build/src${PYTHONPATH:+:$PYTHONPATH}" HF_HOME="$WORK/hf" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" \
        bash -c "ip link set lo up; $overlay; exec bash -ex test.sh" > "$out" 2>&1) || rc=$?
    ran=0 passed=0
    case $suite in
        L0_check_health_vllm) logs=(); for log in "$dir"/health_check_*.log; do  # each test's, not its server's
            [[ $log == *.server.log ]] || logs+=("$log"); done ;;
        L0_additional_outputs_vllm) logs=("$out") ;;
        *) logs=("$dir"/*_client.log) ;;
    esac
    if [ "$suite" = L0_backend_vllm/metrics_test ]; then  # one test a server, the client's log overwritten
        ran=$(grep -cE '^\+ python3 ./vllm_metrics_test.py' "$out" || true)
        passed=$((ran - $(grep -cE '^\*\*\* (Running ./vllm_metrics_test.py .* FAILED|Test Result Verification FAILED)' \
            "$out" || true)))
    else
        for log in "${logs[@]}"; do
            read -r r p < <(count "$log")
            ran=$((ran + r)); passed=$((passed + p))
        done
    fi
    echo "$suite: test.sh exit $rc; $ran tests run, $passed passed (log: $out)"
done
