#!/bin/bash
# Run Triton's core QA suites (triton-inference-server/server qa/L0_*) against Conveyor's `tritonserver`, each
# suite's own test.sh and test files unchanged (see docs/COMPATIBILITY.md).
#
#   deploy/triton_qa_core.sh TRITON_SERVER_CHECKOUT [WORK_DIR [SUITE...]]
#
# SUITE: an L0_* folder of qa/, or `scheduler` (L0_batcher L0_sequence_batcher L0_dyna_sequence_batcher
# L0_sequence_corrid_batcher L0_priority L0_model_queue L0_rate_limiter, the default), or `all` (those and the
# rest of docs/COMPATIBILITY.md's list). Each runs as Triton's CI runs it: `bash -x test.sh REPO_VERSION` in its
# folder of a copy of qa/ (WORK_DIR/qa), with the environment its test.sh reads, and prints one row: the tests it
# ran and passed (from its client logs), test.sh's verdict, and what it could not run here and why.
#
# TRITON_SERVER_CHECKOUT: a checkout (or `git archive`) of triton-inference-server/server. Its qa/ is copied, never
# changed. The model repositories test.sh copies from /data/inferenceserver/REPO_VERSION are made once, in
# WORK_DIR/data, by Triton's own generators (qa/common/gen_qa_*.py, as qa/common/gen_qa_model_repository runs
# them in Triton's CI): --onnx always; --libtorch where torch is installed (the generators make KIND_CPU models
# without a GPU); --openvino where openvino still has the openvino.runtime API the generators use (openvino 2026
# does not). TensorRT (plan) models need a GPU and TensorRT; the generators make no TensorFlow models.
#
# Each suite runs in namespaces of its own (`unshare -rnmpf`): a network one with only lo up (the tests use the
# fixed ports 8000-8002), a pid one (ending the suite ends every server it left), and a mount one whose root
# shows /data/inferenceserver (WORK_DIR/data) and /opt/tritonserver (WORK_DIR/triton: bin/tritonserver is
# Conveyor's), the paths several test.sh hard-code, and a /dev/shm of its own. Nothing outside WORK_DIR is written.
#
# KIND_GPU_AS_CPU=1 (a CPU host's check of the schedulers, not Triton's run): the generated models' KIND_GPU
# instance groups become KIND_CPU, in a copy (WORK_DIR/data-cpu) that /data shows instead. Triton's generators give
# every sequence model KIND_GPU, and Triton (as Conveyor) refuses KIND_GPU without a GPU, so without it the
# sequence suites stop at their first server here. The suite's own config.pbtxt files (in its copy) get the same;
# groups that a test.sh itself writes stay as it writes them.
#
# TRITONSERVER (default: the tritonserver beside $PYTHON, running this checkout's build/src) is the server
# command (it has Triton's defaults where `conveyor serve`'s differ); every server it starts also gets CONVEYOR_FLAGS
# (default none). REPO_VERSION (default: the checkout's TRITON_VERSION) names the data folder. BACKENDS, ENSEMBLES,
# MODEL_TRIALS, ... set by the caller pass through to test.sh as in Triton's CI; unset, BACKENDS is each suite's
# own default less what cannot be made here (plan). SUITE_TIMEOUT (seconds, default 14400) bounds one suite.
# Needs the triton-qa extra (tritonclient, onnx, torch, numpy), jq, curl, and user namespaces.
# The whole script is one block, read before it runs: editing the file during a run (hours) does not change it.
{
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
TRITON=$(realpath "$1")
WORK=$(realpath -m "${2:-$(mktemp -d)}")
shift $(( $# < 2 ? $# : 2 ))
SUITES=("$@")
SCHEDULER=(L0_batcher L0_sequence_batcher L0_dyna_sequence_batcher L0_sequence_corrid_batcher L0_priority
           L0_model_queue L0_rate_limiter)
ALL=("${SCHEDULER[@]}" L0_implicit_state L0_lifecycle L0_model_update L0_request_cancellation L0_decoupled
     L0_response_cache L0_response_statistics L0_metrics L0_trace L0_parameters L0_optional_input L0_string_io
     L0_large_payload L0_json L0_nan_inf L0_infer L0_simple_ensemble L0_model_config L0_warmup L0_sagemaker
     L0_vertex_ai L0_orca L0_client_timeout L0_http_fuzz)
[ ${#SUITES[@]} -eq 0 ] && SUITES=(scheduler)
case ${SUITES[0]} in scheduler) SUITES=("${SCHEDULER[@]}") ;; all) SUITES=("${ALL[@]}") ;; esac
PY=${PYTHON:-python}
case $PY in /*) ;; */*) PY=$PWD/$PY ;; *) PY=$(command -v "$PY") ;; esac  # the tests run elsewhere
SERVER=${TRITONSERVER:-$(dirname "$PY")/tritonserver}
case $SERVER in /*) ;; */*) SERVER=$PWD/$SERVER ;; esac
REPO_VERSION=${REPO_VERSION:-$(cat "$TRITON/TRITON_VERSION" 2> /dev/null || echo local)}
SUITE_TIMEOUT=${SUITE_TIMEOUT:-14400}
DATA=$WORK/data/inferenceserver/$REPO_VERSION
mkdir -p "$WORK/logs" "$DATA"

has() { "$PY" -c "import $1" > /dev/null 2>&1; }  # MODULE: installed in $PYTHON's environment

# --- the model repositories (/data/inferenceserver/REPO_VERSION), each made once ----------------------------------

# gen NAME SCRIPT ARGS...: qa/common/SCRIPT ARGS --models_dir=DATA/NAME, unless done before (a stamp per command,
# as several generators fill one repository); its output in WORK/logs/gen.log.
gen() {
    local name=$1 script=$2; shift 2
    local stamp
    stamp="$WORK/data/.made.$(echo "$name $script $*" | md5sum | cut -c1-16)"
    [ -e "$stamp" ] && return 0
    echo "making $name: $script $*"
    mkdir -p "$DATA/$name"
    (cd "$TRITON/qa/common" && "$PY" "$script" "$@" --models_dir="$DATA/$name") >> "$WORK/logs/gen.log" 2>&1 \
        || { echo "$script $* failed: see $WORK/logs/gen.log" >&2; return 1; }
    touch "$stamp"
}

make_models() {  # gen_qa_model_repository's ONNX, PyTorch and OpenVINO steps, less the image and custom-op models
    local o=(--onnx --onnx_opset=0)
    gen qa_model_repository gen_qa_models.py "${o[@]}"
    gen qa_variable_model_repository gen_qa_models.py "${o[@]}" --variable
    gen qa_identity_model_repository gen_qa_identity_models.py "${o[@]}"
    gen qa_reshape_model_repository gen_qa_reshape_models.py "${o[@]}" --variable
    gen qa_sequence_model_repository gen_qa_sequence_models.py "${o[@]}"
    gen qa_variable_sequence_model_repository gen_qa_sequence_models.py "${o[@]}" --variable
    gen qa_sequence_initial_state_implicit_model_repository gen_qa_implicit_models.py "${o[@]}" --initial-state zero
    gen qa_variable_sequence_initial_state_implicit_model_repository gen_qa_implicit_models.py "${o[@]}" \
        --initial-state zero --variable
    gen qa_sequence_implicit_model_repository gen_qa_implicit_models.py "${o[@]}"
    gen qa_variable_sequence_implicit_model_repository gen_qa_implicit_models.py "${o[@]}" --variable
    gen qa_dyna_sequence_model_repository gen_qa_dyna_sequence_models.py "${o[@]}"
    gen qa_dyna_sequence_implicit_model_repository gen_qa_dyna_sequence_implicit_models.py "${o[@]}"
    gen qa_ragged_model_repository gen_qa_ragged_models.py "${o[@]}"
    gen qa_scalar_models gen_qa_ort_scalar_models.py --onnx_opset=0
    gen qa_ensemble_model_repository/qa_model_repository gen_qa_models.py --ensemble
    gen qa_ensemble_model_repository/qa_variable_model_repository gen_qa_models.py --ensemble --variable
    gen qa_ensemble_model_repository/qa_reshape_model_repository gen_qa_reshape_models.py --ensemble
    gen qa_ensemble_model_repository/qa_identity_model_repository gen_qa_identity_models.py --ensemble
    gen qa_ensemble_model_repository/qa_sequence_model_repository gen_qa_sequence_models.py --ensemble
    gen qa_ensemble_model_repository/qa_variable_sequence_model_repository gen_qa_sequence_models.py --ensemble \
        --variable
    if has torch; then  # TorchScript on the CPU
        gen qa_model_repository gen_qa_models.py --libtorch
        gen qa_variable_model_repository gen_qa_models.py --libtorch --variable
        gen qa_identity_model_repository gen_qa_identity_models.py --libtorch
        gen qa_reshape_model_repository gen_qa_reshape_models.py --libtorch --variable
        gen qa_sequence_model_repository gen_qa_sequence_models.py --libtorch
        gen qa_variable_sequence_model_repository gen_qa_sequence_models.py --libtorch --variable
        gen qa_sequence_implicit_model_repository gen_qa_implicit_models.py --libtorch
        gen qa_variable_sequence_implicit_model_repository gen_qa_implicit_models.py --libtorch --variable
        gen qa_dyna_sequence_model_repository gen_qa_dyna_sequence_models.py --libtorch
        gen qa_ragged_model_repository gen_qa_ragged_models.py --libtorch
    fi
    if has openvino.runtime; then  # the generators' API: openvino 2026 no longer has it
        gen qa_model_repository gen_qa_models.py --openvino
        gen qa_reshape_model_repository gen_qa_reshape_models.py --openvino
    fi
}

# --- the layout test.sh expects ------------------------------------------------------------------------------------

# Triton's install: TRITON_DIR/bin/tritonserver (Conveyor's), TRITON_DIR/backends (--backend-directory) and, as in
# Triton's QA container, TRITON_DIR/qa (L0_model_config copies its Python models from /opt/tritonserver/qa).
mkdir -p "$WORK/triton/bin" "$WORK/triton/backends" "$WORK/bin" "$WORK/root"
ln -sfn "$WORK/qa" "$WORK/triton/qa"
rm -f "$WORK/triton/bin/tritonserver"
# exec: test.sh's kill $SERVER_PID reaches the server itself.
printf '#!/bin/sh\nexec %q %s "$@"\n' "$SERVER" "${CONVEYOR_FLAGS-}" \
    > "$WORK/triton/bin/tritonserver"
chmod +x "$WORK/triton/bin/tritonserver"

# Stand-ins for what this host lacks, first on PATH.
# nvidia-smi: there is no GPU (and no driver); it answers as the real one does without a driver, so a test.sh that
# counts GPUs counts none and one that looks for a GPU model finds none.
cat > "$WORK/bin/nvidia-smi" <<'EOF'
#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
exit 9
EOF
# ldconfig: L0_sequence_batcher runs it (`ldconfig || true`) to refresh Triton's container's library cache; here it
# would rewrite the host's /etc/ld.so.cache, and Conveyor loads no shared libraries of Triton's.
printf '#!/bin/sh\nexit 0\n' > "$WORK/bin/ldconfig"
# pip, pip3: some test.sh install their test's packages; they are installed in $PYTHON's environment already
# (the triton-qa extra), and nothing is downloaded inside the namespace.
printf '#!/bin/sh\necho "pip $*: provided by the environment"\n' > "$WORK/bin/pip3"
cp "$WORK/bin/pip3" "$WORK/bin/pip"
chmod +x "$WORK/bin/nvidia-smi" "$WORK/bin/ldconfig" "$WORK/bin/pip3" "$WORK/bin/pip"
# serve: Triton's SageMaker entry script (docker/sagemaker/serve, /usr/bin/serve in Triton's image), unchanged;
# L0_sagemaker starts most of its servers through it. It runs `tritonserver` from PATH: /opt/tritonserver/bin is
# on PATH, as in Triton's image.
cp "$TRITON/docker/sagemaker/serve" "$WORK/bin/serve"
chmod +x "$WORK/bin/serve"

# The namespace's root: every top-level entry of / bound as it is, but /data (WORK/data) and /opt (its entries,
# and tritonserver: WORK/triton); then a proc of the new pid namespace and a /dev/shm of its own. Runs as the
# namespace's init: `ns.sh DIR CMD` runs CMD in DIR there.
cat > "$WORK/ns.sh" <<EOF
set -e
R="$WORK/root"
mount -t tmpfs qa-root "\$R"
for e in /*; do
    n=\${e#/}
    case \$n in data|opt|proc) continue ;; esac
    if [ -L "\$e" ]; then cp -a "\$e" "\$R/\$n"
    elif [ -d "\$e" ]; then mkdir "\$R/\$n"; mount --rbind "\$e" "\$R/\$n"
    else touch "\$R/\$n"; mount --bind "\$e" "\$R/\$n"; fi
done
mkdir -p "\$R/opt/tritonserver" "\$R/data" "\$R/proc"
for e in /opt/*; do [ -d "\$e" ] && mkdir "\$R/opt/\${e#/opt/}" && mount --rbind "\$e" "\$R/opt/\${e#/opt/}"; done
mount --bind "$WORK/triton" "\$R/opt/tritonserver"
mount --bind "\$DATA_ROOT" "\$R/data"
mount -t proc proc "\$R/proc"
mount -t tmpfs -o mode=1777 qa-shm "\$R/dev/shm"
ip link set lo up
dir=\$1; shift
exec chroot "\$R" bash -c 'cd "\$0" && exec "\$@"' "\$dir" "\$@"
EOF

# --- what each suite leaves out here -------------------------------------------------------------------------------

# The BACKENDS a suite tests: its test.sh's default, less plan (TensorRT: a GPU and TensorRT) and what was not made.
backends_for() {
    local defaults
    defaults=$(grep -oE '^BACKENDS=\$\{BACKENDS:="[^"]*"' "$TRITON/qa/$1/test.sh" | head -1 | sed 's/.*:="//; s/"$//') \
        || true
    [ -n "$defaults" ] || return 0
    local out=() b
    for b in $defaults; do
        case $b in
            plan) ;;
            libtorch) has torch && out+=("$b") ;;
            openvino) has openvino.runtime && out+=("$b") ;;
            *) out+=("$b") ;;
        esac
    done
    echo "${out[*]}"
}

# left_out SUITE: what of it cannot run on this host, and why (a GPU, TensorRT, Triton's C++ and Java clients,
# valgrind, and test binaries that Triton's build makes and its qa/ does not hold).
left_out() {
    case $1 in
        L0_batcher) echo "plan models (TensorRT); the custom_zero_1_float32 tests (test.sh gives it KIND_GPU);" \
            "instance_queue_test (a C++ unit test binary of Triton's build)" ;;
        L0_sequence_batcher) echo "plan models (TensorRT); the GPU and shared-memory variants (TEST_*_SHARED_MEMORY)" ;;
        L0_dyna_sequence_batcher) echo "plan models (TensorRT)" ;;
        L0_sequence_corrid_batcher) echo "test_skip_batch's first trial is plan, hard-coded (TensorRT)" ;;
        L0_priority) echo "all: its models are TensorRT plans, whose CUDA stream priority it checks" ;;
        L0_model_queue) echo "plan models (TensorRT)" ;;
        L0_rate_limiter) echo "all but the load checks: test.sh gives its models KIND_GPU instance groups" ;;
        L0_implicit_state) echo "plan models (TensorRT); without KIND_GPU_AS_CPU=1 no server starts (its" \
            "growable_memory model is KIND_GPU)" ;;
        L0_request_cancellation) echo "request_cancellation_test and grpc_cancellation_test (C++ binaries of" \
            "Triton's build); 4 grpc_cancellation_test.py cases drive Triton's gRPC frontend through its" \
            "TRITONSERVER_DELAY_GRPC_* hooks and count its handler log lines, as test.sh does after each case" ;;
        L0_response_cache) echo "Redis (no redis-server here: test.sh stops at its first start_redis, before" \
            "the ensemble tests, which pass by hand; Conveyor has only the local cache); response_cache_test (a C++" \
            "unit binary); the valgrind/perf_analyzer memory test" ;;
        L0_large_payload) echo "plan models (TensorRT); its 3 GB and 1.9 GB tensors need ~10 GB of client memory" ;;
        L0_simple_ensemble) echo "nothing" ;;
        *) echo "plan models (TensorRT), GPU-only tests" ;;
    esac
}
skip_suite() {  # SUITE: nothing of it can run here (its reason is left_out's)
    case $1 in L0_priority) return 0 ;; esac
    return 1
}

# --- counting ------------------------------------------------------------------------------------------------------

# prepare SUITE DIR: what Triton's Dockerfile.QA adds to the suite's folder (DIR) from the server checkout before its
# CI runs it: L0_simple_ensemble's `simple` versions 1 and 2 are docs/examples' simple/1/model.onnx.
prepare() {
    case $1 in
        L0_simple_ensemble)
            local v
            for v in 1 2; do
                mkdir -p "$2/models/simple/$v"
                cp "$TRITON/docs/examples/model_repository/simple/1/model.onnx" "$2/models/simple/$v/"
            done ;;
    esac
}

# nested SUITE: the other suites its test.sh runs itself (L0_implicit_state ends with L0_sequence_batcher's test.sh,
# in IMPLICIT_STATE mode): each is copied afresh with it and counted in its row.
nested() {
    case $1 in L0_implicit_state) echo L0_sequence_batcher ;; esac
}

# count DIR...: "run passed" over the client logs in each DIR: each unittest run's "Ran N tests" less its
# "FAILED (failures=F, errors=E)" (capped at N), each pytest run's "N passed, M failed"; server logs hold neither.
# A DIR whose logs hold none of these (its test.sh sent the client's unittest report to its own output) counts its
# test_results.txt, the last client's own count (qa/common/test_util.py TestResultCollector).
count() {
    local d r p total=0 ok=0
    for d in "$@"; do
        read -r r p < <(count_logs "$d")
        if [ "$r" = 0 ] && [ -f "$d/test_results.txt" ]; then
            r=$(jq -r '.total // 0' "$d/test_results.txt" 2> /dev/null || echo 0)
            p=$(( r - $(jq -r '(.errors // 0) + (.failures // 0)' "$d/test_results.txt" 2> /dev/null || echo 0) ))
        fi
        total=$(( total + r )) ok=$(( ok + p ))
    done
    echo "$total $ok"
}
count_logs() {
    find "$1" -maxdepth 1 -type f \( -name '*.log' -o -name '*.txt' \) ! -name '*server.log' -exec cat {} + \
        | awk '
            /^Ran [0-9]+ test/ { ran += $2; last = $2 }
            /^FAILED \(/ { bad = 0
                while (match($0, /(failures|errors)=[0-9]+/)) {
                    split(substr($0, RSTART, RLENGTH), kv, "="); bad += kv[2]; $0 = substr($0, RSTART + RLENGTH) }
                failed += (bad > last ? last : bad) }
            /^=+ .* in [0-9.]+s/ { p = 0; f = 0
                if (match($0, /[0-9]+ passed/)) p = substr($0, RSTART, RLENGTH) + 0
                if (match($0, /[0-9]+ (failed|error)/)) f = substr($0, RSTART, RLENGTH) + 0
                ran += p + f; failed += f }
            END { printf "%d %d\n", ran, ran - failed }'
}

# --- the runs ------------------------------------------------------------------------------------------------------

make_models
DATA_ROOT=$WORK/data
if [ "${KIND_GPU_AS_CPU:-0}" = 1 ]; then
    DATA_ROOT=$WORK/data-cpu
    rm -rf "$DATA_ROOT" && cp -r "$WORK/data" "$DATA_ROOT"
    find "$DATA_ROOT" -name config.pbtxt -exec sed -i 's/KIND_GPU/KIND_CPU/g' {} +
fi
# qa/ once; each suite's folder afresh before it runs (so that two runs of other suites can share WORK_DIR).
[ -d "$WORK/qa" ] || cp -r "$TRITON/qa" "$WORK/qa"

ROWS=()
for suite in "${SUITES[@]}"; do
    dir=$WORK/qa/$suite
    [ -f "$TRITON/qa/$suite/test.sh" ] || { echo "unknown suite: $suite" >&2; exit 2; }
    rm -rf "$dir" && cp -r "$TRITON/qa/$suite" "$dir"
    prepare "$suite" "$dir"
    counted=("$dir")
    for n in $(nested "$suite"); do
        rm -rf "$WORK/qa/$n" && cp -r "$TRITON/qa/$n" "$WORK/qa/$n"
        counted+=("$WORK/qa/$n")
    done
    # KIND_GPU_AS_CPU: the suite's own model configs too (L0_implicit_state's growable_memory is KIND_GPU, and a
    # model that cannot load stops the server); what test.sh writes later stays as it writes it.
    [ "${KIND_GPU_AS_CPU:-0}" = 1 ] && find "$dir" -name config.pbtxt -exec sed -i 's/KIND_GPU/KIND_CPU/g' {} +
    out=$WORK/logs/$suite.log  # outside the folder: test.sh removes its *.log
    if skip_suite "$suite"; then
        ROWS+=("| $suite | 0 | 0 | not run | $(left_out "$suite") |")
        echo "${ROWS[-1]}"
        continue
    fi
    # NVIDIA_TRITON_SERVER_VERSION: as in Triton's container; a test.sh that runs another suite's test.sh without
    # arguments (L0_implicit_state) gives that one its REPO_VERSION through it. TRITON_SERVER_CPU_ONLY: what
    # Triton's CPU-only CI sets (L0_infer then runs its CPU target only, and infer_test.py leaves its GPU cases).
    env_args=(NVIDIA_TRITON_SERVER_VERSION="$REPO_VERSION" TRITON_DIR=/opt/tritonserver
              DATADIR="/data/inferenceserver/$REPO_VERSION" TEST_WINDOWS=0 TEST_JETSON=0
              TEST_VALGRIND=0 TEST_SYSTEM_SHARED_MEMORY=0 TEST_CUDA_SHARED_MEMORY=0 TRITON_SERVER_CPU_ONLY=1
              PATH="$WORK/bin:/opt/tritonserver/bin:$(dirname "$PY"):$PATH" PYTHONPATH="$HERE/build/src${PYTHONPATH:+:$PYTHONPATH}")
    if [ -z "${BACKENDS+set}" ]; then
        b=$(backends_for "$suite")
        [ -n "$b" ] && env_args+=(BACKENDS="$b")
    fi
    # Conveyor's group folders (IPC sockets, the group-name locks) default to /tmp, which every namespace shares:
    # each suite gets its own, so its servers neither meet nor rename themselves after another run's.
    rundir=$(mktemp -d /tmp/cqa.XXXXXX)  # short: unix socket paths are at most 107 bytes
    env_args+=(CONVEYOR_RUN_DIR="$rundir")
    echo "=== $suite (log: $out)"
    start=$SECONDS
    rc=0
    timeout -k 30 "$SUITE_TIMEOUT" unshare -rnmpf --kill-child env DATA_ROOT="$DATA_ROOT" "${env_args[@]}" \
        bash "$WORK/ns.sh" "$dir" bash -x test.sh "$REPO_VERSION" > "$out" 2>&1 || rc=$?
    rm -rf "$rundir"
    read -r ran passed < <(count "${counted[@]}")
    verdict="exit $rc"
    grep -q '^\*\*\* Test Passed' "$out" && verdict="Test Passed"
    grep -q '^\*\*\* Test FAILED' "$out" && verdict="Test FAILED"
    [ $rc = 124 ] && verdict="timed out after ${SUITE_TIMEOUT}s"
    notes=$(left_out "$suite")
    [ "${KIND_GPU_AS_CPU:-0}" = 1 ] && notes="KIND_GPU models run as KIND_CPU (KIND_GPU_AS_CPU=1); $notes"
    # test.sh stops at the first server that does not start: say which, and the first reason its log gives.
    if stopped=$(grep -m1 -oE '^\*\*\* Failed to start .*' "$out"); then
        slog=$(grep -oE '^\+ SERVER_LOG=.*' "$out" | tail -1 | sed 's/^+ SERVER_LOG=//')
        why=$(grep -m1 -oE "(failed to load|is not available|not supported).*" "$dir/$slog" 2> /dev/null \
              | cut -c1-200 || true)
        notes="$notes; test.sh stopped: a server did not start ($slog: ${why:-see the log})"
    fi
    ROWS+=("| $suite | $ran | $passed | $verdict, $(( (SECONDS - start) / 60 )) min | $notes |")
    echo "${ROWS[-1]}"
done

echo
echo "| suite | tests run | passed | test.sh | not run here, and why |"
echo "|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}" | tee -a "$WORK/logs/summary.md"
exit
}
