#!/bin/bash
# Run Triton's Python-backend QA (qa/L0_backend_python) against Conveyor's `tritonserver`
# (see docs/COMPATIBILITY.md and docs/PYTHON-BACKEND.md).
#
#   deploy/triton_qa_python.sh TRITON_SERVER_CHECKOUT PYTHON_BACKEND_CHECKOUT [WORK_DIR [SUITE...]]
#
# SUITE: python (python_test.py, with test.sh's start-up checks), decoupled, io, lifecycle,
# response_sender, parameters, ensemble, bls, model_control, argument_validation,
# model_readiness, request_rescheduling, async_execute, custom_metrics; or all (the default).
# Each suite's models are assembled as its test.sh assembles them, and its test files run as
# they are, against a server on localhost:8000/8001/8002.
#
# TRITON_SERVER_CHECKOUT: a checkout (or `git archive`) of triton-inference-server/server with
# qa/; PYTHON_BACKEND_CHECKOUT: one of triton-inference-server/python_backend (its
# examples/decoupled square model). Neither is copied into this repository: qa/L0_backend_python,
# qa/python_models and qa/common are copied into WORK_DIR/qa, where the test files find each
# other by relative paths and write their logs, as in Triton's container (TRITON_DIR=WORK_DIR).
# The servers and tests run in a network namespace of their own (`unshare -rn`), so nothing
# else on the host is disturbed.
#
# TRITONSERVER (default: the tritonserver beside $PYTHON) is the server command: point it at
# another build of Conveyor, or at a real tritonserver wrapper for a side-by-side run.
# Needs pip install -e '.[triton-qa]' (tritonclient, pytest, torch, ml_dtypes).
#
# Not run, as they need what this host lacks: GPU tensors (the tests skip or fail the same on
# Triton without a GPU), the TorchScript/ONNX sequence models of /data/inferenceserver (the
# ensemble_gpu and BLS libtorch models), test.sh's stub-process checks (Conveyor has no stub:
# model_readiness's kill of `triton_python_backend_stub`), and the suites outside the list
# above (env, variants, examples, restart, logging, python_based_backends).
set -euo pipefail
TRITON=$(realpath "$1")
PYBACKEND=$(realpath "$2")
WORK=$(realpath -m "${3:-$(mktemp -d)}")
shift $(( $# < 3 ? $# : 3 ))
SUITES=("$@")
ALL=(python decoupled io lifecycle response_sender parameters ensemble bls model_control argument_validation
     model_readiness request_rescheduling async_execute custom_metrics)
[ ${#SUITES[@]} -eq 0 ] && SUITES=(all)
[ "${SUITES[0]}" = all ] && SUITES=("${ALL[@]}")
PY=${PYTHON:-python}
case $PY in /*) ;; */*) PY=$PWD/$PY ;; *) PY=$(command -v "$PY") ;; esac  # the tests run elsewhere
SERVER=${TRITONSERVER:-$(dirname "$PY")/tritonserver}
case $SERVER in /*) ;; */*) SERVER=$PWD/$SERVER ;; esac

# Triton's files, copied into WORK (as test.sh finds them in /opt/tritonserver/qa).
QA=$WORK/qa
B=$QA/L0_backend_python
mkdir -p "$QA" "$WORK/logs"
rm -rf "$QA/L0_backend_python" "$QA/python_models" "$QA/common"
cp -r "$TRITON/qa/L0_backend_python" "$TRITON/qa/python_models" "$TRITON/qa/common" "$QA/"
PM=$QA/python_models
# shm_util's leak probe watches the Python backend stub's shared-memory regions
# (/dev/shm/triton_python_backend_shm_region_*) through triton_shm_monitor, a C extension of
# Triton's QA image. Conveyor has no such regions (any on the host belong to other servers), so
# the probe has nothing to watch: a stand-in whose regions never change lets the tests run.
mkdir -p "$WORK/qa_stubs"
cat > "$WORK/qa_stubs/triton_shm_monitor.py" <<'EOF'
"""Stand-in: Conveyor has no triton_python_backend_shm_region_* segments to watch."""


class SharedMemoryManager:
    def __init__(self, name):
        self.name = name

    def free_memory(self):
        return 0
EOF

# --- models, as each test.sh makes them (outside the namespace) ------------------------------

model() {  # DEST_REPO NAME SRC: qa/python_models/SRC as a repository entry NAME
    mkdir -p "$1/$2/1"
    cp "$PM/$3/model.py" "$1/$2/1/"
    cp "$PM/$3/config.pbtxt" "$1/$2/"
}

rename() {  # CONFIG NAME
    sed -i "s/^name:.*/name: \"$2\"/" "$1"
}

models_python() {  # L0_backend_python/test.sh, the models of python_test.py
    local M=$B/models
    rm -rf "$M" && mkdir -p "$M"
    model "$M" identity_fp32 identity_fp32
    model "$M" identity_bf16 identity_bf16
    cp -r "$M/identity_fp32" "$M/identity_uint8"
    rename "$M/identity_uint8/config.pbtxt" identity_uint8
    sed -i "s/TYPE_FP32/TYPE_UINT8/g; s/^max_batch_size:.*/max_batch_size: 8/" "$M/identity_uint8/config.pbtxt"
    echo "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 12000000 }" \
        >> "$M/identity_uint8/config.pbtxt"
    cp -r "$M/identity_fp32" "$M/identity_uint8_nobatch"
    rename "$M/identity_uint8_nobatch/config.pbtxt" identity_uint8_nobatch
    sed -i "s/TYPE_FP32/TYPE_UINT8/g; s/^max_batch_size:.*//" "$M/identity_uint8_nobatch/config.pbtxt"
    cp -r "$M/identity_fp32" "$M/identity_uint32"
    rename "$M/identity_uint32/config.pbtxt" identity_uint32
    sed -i "s/TYPE_FP32/TYPE_UINT32/g" "$M/identity_uint32/config.pbtxt"
    cp -r "$M/identity_fp32" "$M/identity_bool"
    rename "$M/identity_bool/config.pbtxt" identity_bool
    sed -i "s/TYPE_FP32/TYPE_BOOL/g" "$M/identity_bool/config.pbtxt"
    cp -r "$M/identity_fp32" "$M/default_model_name"
    mv "$M/default_model_name/1/model.py" "$M/default_model_name/1/mymodel.py"
    rename "$M/default_model_name/config.pbtxt" default_model_name
    echo 'default_model_filename: "mymodel.py"' >> "$M/default_model_name/config.pbtxt"
    model "$M" pytorch_fp32_fp32 pytorch_fp32_fp32
    rename "$M/pytorch_fp32_fp32/config.pbtxt" pytorch_fp32_fp32
    model "$M" delayed_model delayed_model
    model "$M" init_args init_args
    sed -i "s|TRITON_DIR_PATH|$WORK|" "$M/init_args/config.pbtxt"
    for m in optional non_contiguous string string_fixed dlpack_identity; do model "$M" $m $m; done
    # test.sh's start-up checks, each a repository of its own
    local C=$B/checks
    rm -rf "$C" && mkdir -p "$C"
    mkdir -p "$C/multi_file/multi_file/1"
    cp "$PM"/multi_file/*.py "$C/multi_file/multi_file/1/"
    cp "$PM/identity_fp32/config.pbtxt" "$C/multi_file/multi_file/"
    rename "$C/multi_file/multi_file/config.pbtxt" multi_file
    model "$C/model_env" model_env model_env
    model "$C/init_exit" init_exit init_exit
    mkdir -p "$C/non_existent/non_existent_model/1"
    cp "$PM/identity_fp32/config.pbtxt" "$C/non_existent/non_existent_model/"
    rename "$C/non_existent/non_existent_model/config.pbtxt" non_existent_model
}

models_decoupled() {
    local M=$B/decoupled/models  # holds decoupled_* models of its own already
    model "$M" identity_fp32 identity_fp32
    model "$M" execute_cancel execute_cancel
    echo "model_transaction_policy { decoupled: True }" >> "$M/execute_cancel/config.pbtxt"
    model "$M" response_sender_until_cancelled response_sender_until_cancelled
    mkdir -p "$M/square_int32/1"
    cp "$PYBACKEND/examples/decoupled/square_model.py" "$M/square_int32/1/model.py"
    cp "$PYBACKEND/examples/decoupled/square_config.pbtxt" "$M/square_int32/config.pbtxt"
    model "$M" dlpack_add_sub dlpack_add_sub
}

models_io() {  # one repository per test.sh step: io/models.<step>
    local D=$B/io
    rm -rf "$D"/models.*
    for trial in default decoupled; do
        local src=dlpack_io_identity
        [ $trial = decoupled ] && src=dlpack_io_identity_decoupled
        for i in 1 2 3; do
            model "$D/models.ensemble_$trial" dlpack_io_identity_$i $src
            rename "$D/models.ensemble_$trial/dlpack_io_identity_$i/config.pbtxt" dlpack_io_identity_$i
        done
        mkdir -p "$D/models.ensemble_$trial/ensemble_io/1"
        cp "$PM/ensemble_io/config.pbtxt" "$D/models.ensemble_$trial/ensemble_io/"
    done
    model "$D/models.empty_gpu_output" dlpack_empty_output dlpack_empty_output
    model "$D/models.variable_gpu_output" variable_gpu_output variable_gpu_output
    model "$D/models.requested_output" add_sub add_sub
    model "$D/models.requested_output" dlpack_io_identity_decoupled dlpack_io_identity_decoupled
    mkdir -p "$D/models.prior_crash/llm/1"
    cp "$D/requested_output_model/config.pbtxt" "$D/models.prior_crash/llm/"
    cp "$D/requested_output_model/model.py" "$D/models.prior_crash/llm/1/"
}

models_lifecycle() {
    local M=$B/lifecycle/models
    rm -rf "$M" && mkdir -p "$M"
    for m in error_code execute_cancel execute_error execute_grpc_error decoupled_grpc_error execute_return_error \
             wrong_model; do
        model "$M" $m $m
    done
    for m in execute_error execute_grpc_error wrong_model; do rename "$M/$m/config.pbtxt" $m; done
    sed -i "s/^max_batch_size:.*/max_batch_size: 8/" "$M/execute_error/config.pbtxt" "$M/execute_grpc_error/config.pbtxt"
    echo "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 12000000 }" \
        >> "$M/execute_error/config.pbtxt"
    echo "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 1200000 }" \
        >> "$M/execute_grpc_error/config.pbtxt"
    sed -i "s/TYPE_FP32/TYPE_UINT32/g" "$M/wrong_model/config.pbtxt"
    local C=$B/lifecycle/checks
    rm -rf "$C" && mkdir -p "$C"
    model "$C/init_error" init_error init_error
    model "$C/fini_error" fini_error fini_error
    mkdir -p "$C/auto_complete_error/auto_complete_error/1"
    cp "$PM/auto_complete_error/model.py" "$C/auto_complete_error/auto_complete_error/1/"
}

models_response_sender() {
    local M=$B/response_sender/models
    rm -rf "$M" "$M.complete_final" && mkdir -p "$M"
    local name file decoupled batching
    for name in response_sender response_sender_decoupled response_sender_async response_sender_decoupled_async \
                response_sender_batching response_sender_decoupled_batching response_sender_async_batching \
                response_sender_decoupled_async_batching; do
        file=model.py; [[ $name == *async* ]] && file=model_async.py
        mkdir -p "$M/$name/1"
        cp "$PM/response_sender/model_common.py" "$M/$name/1/"
        cp "$PM/response_sender/$file" "$M/$name/1/model.py"
        cp "$PM/response_sender/config.pbtxt" "$M/$name/"
        [[ $name == *decoupled* ]] && echo "model_transaction_policy { decoupled: True }" >> "$M/$name/config.pbtxt"
        [[ $name == *batching ]] && echo "dynamic_batching { max_queue_delay_microseconds: 500000 }" \
            >> "$M/$name/config.pbtxt"
    done
    model "$M.complete_final" response_sender_complete_final response_sender_complete_final
}

models_parameters() {
    local M=$B/parameters/models
    rm -rf "$M" && mkdir -p "$M"
    for m in response_parameters response_parameters_decoupled response_parameters_bls; do model "$M" $m $m; done
}

models_ensemble() {  # without ensemble_gpu (a GPU TorchScript model from /data/inferenceserver)
    local M=$B/ensemble/models
    rm -rf "$M" && mkdir -p "$M/ensemble/1"
    cp "$PM/ensemble/config.pbtxt" "$M/ensemble/"
    model "$M" add_sub_1 add_sub
    model "$M" add_sub_2 add_sub
}

models_bls() {
    local M=$B/bls/models
    rm -rf "$M" "$B/bls/checks" "$B/bls/params_models" && mkdir -p "$M"
    for m in bls dlpack_add_sub bls_async bls_memory bls_memory_async add_sub execute_error identity_fp32 \
             dlpack_identity dlpack_square identity_fp32_timeout; do
        model "$M" $m $m
    done
    mkdir -p "$M/square_int32/1"
    cp "$PYBACKEND/examples/decoupled/square_model.py" "$M/square_int32/1/model.py"
    cp "$PYBACKEND/examples/decoupled/square_config.pbtxt" "$M/square_int32/config.pbtxt"
    # onnx_nobatch_sequence_int32 and libtorch_{cpu,gpu} come from /data/inferenceserver: the tests
    # that call them need the GPU anyway (test_gpu_bls, test_bls_sequence's GPU half).
    local C=$B/bls/checks
    model "$C/init_error" bls_init_error bls_init_error
    model "$C/finalize_error" bls_finalize_error bls_finalize_error
    model "$B/bls/params_models" bls_parameters bls_parameters
}

models_model_control() {
    local M=$B/model_control/models
    rm -rf "$M" && mkdir -p "$M/simple_identity_fp32/1"
    model "$M" identity_fp32 identity_fp32
    cp "$PM/simple_identity_fp32/config.pbtxt" "$M/simple_identity_fp32/"
}

models_argument_validation() { :; }  # its models/ is in the suite's folder

models_model_readiness() {  # the user-defined readiness functions (Triton 2.6x)
    local M=$B/model_readiness/models
    rm -rf "$M" && mkdir -p "$M"
    model "$M" identity_fp32 identity_fp32
    local name value delay
    while read -r name value delay; do
        mkdir -p "$M/$name/1"
        if [ "$name" = is_ready_fn_coroutine_returns_true ]; then
            cp "$B/model_readiness/test_models/readiness_coroutine_model.py" "$M/$name/1/model.py"
        else
            cp "$B/model_readiness/test_models/readiness_model.py" "$M/$name/1/model.py"
        fi
        cp "$M/identity_fp32/config.pbtxt" "$M/$name/"
        rename "$M/$name/config.pbtxt" "$name"
        printf 'parameters: {\n  key: "READINESS_FN_RETURN_VALUE"\n  value: { string_value: "%s" }\n}\nparameters: {\n  key: "READINESS_FN_DELAY_SECS"\n  value: { string_value: "%s" }\n}\n' \
            "$value" "$delay" >> "$M/$name/config.pbtxt"
    done <<EOF
is_ready_fn_returns_true true 0.1
is_ready_fn_returns_false false 0.1
is_ready_fn_raises_error exception 0.1
is_ready_fn_returns_non_boolean non_boolean 0.1
is_ready_fn_timeout true 8
is_ready_fn_coroutine_returns_true coroutine 0.1
EOF
    mkdir -p "$M/is_ready_fn_returns_true_decoupled/1"
    cp "$B/model_readiness/test_models/is_ready_fn_returns_true_decoupled/model.py" \
        "$M/is_ready_fn_returns_true_decoupled/1/"
    cp "$B/model_readiness/test_models/is_ready_fn_returns_true_decoupled/config.pbtxt" \
        "$M/is_ready_fn_returns_true_decoupled/"
}

models_request_rescheduling() {
    local M=$B/request_rescheduling/models
    rm -rf "$M" && mkdir -p "$M"
    for m in bls_request_rescheduling request_rescheduling_addsub iterative_sequence wrong_return_type; do
        model "$M" $m $m
    done
}

models_async_execute() {
    local M=$B/async_execute/models
    rm -rf "$M" && mkdir -p "$M"
    model "$M" async_execute_decouple async_execute_decouple
    model "$M" async_execute_decouple_bls async_execute_decouple_bls
}

models_custom_metrics() {
    local M=$B/custom_metrics/models
    rm -rf "$M" && mkdir -p "$M"
    model "$M" custom_metrics custom_metrics
}

# --- the runs, inside the namespace --------------------------------------------------------

# serve LOG ARGS...: start the server (its log in LOG, as test.sh names it) in a process group of
# its own and wait until it is ready (0), or has exited (1), or 120 s passed (2: it is stopped);
# stop: SIGINT, as test.sh's kill_server, and wait; after 60 s (a request a test left open keeps
# a worker draining) the whole group is killed and its shared memory removed. t LABEL CMD...: one test
# command, its output kept. check LABEL CMD...: one of test.sh's own checks (a grep, a start-up
# that must fail), PASS or FAIL.
cat > "$WORK/lib.sh" <<INNER
set -u
ip link set lo up
export PY="$PY" SERVER="$SERVER" TRITON_DIR="$WORK" TEST_WINDOWS=0 TEST_JETSON=0
export PYTHONPATH="$WORK/qa_stubs\${PYTHONPATH:+:\$PYTHONPATH}"
LOGS="$WORK/logs"
server=0
alive() {  # the server process runs (an exited child stays, a zombie, until waited for)
    case \$(ps -o stat= -p \$server 2> /dev/null) in ""|Z*) return 1 ;; esac
}
serve() {
    local log=\$1; shift
    setsid "\$SERVER" --group pyqa\$\$ --log-verbose=1 "\$@" > "\$log" 2>&1 &
    server=\$!
    for _ in \$(seq 1 240); do
        curl -sf localhost:8000/v2/health/ready > /dev/null && return 0
        alive || { wait \$server; server=0; return 1; }
        sleep 0.5
    done
    stop
    return 2
}
stop() {
    [ \$server = 0 ] && return 0
    kill -INT \$server
    for _ in \$(seq 1 120); do alive || break; sleep 0.5; done
    if alive; then
        echo "the server did not stop in 60 s: killing its processes" >> "\$LOGS/\$SUITE.log"
        kill -KILL -- -\$server
        rm -f /dev/shm/conveyor.pyqa\$\$.*
    fi
    wait \$server
    server=0
}
t() {
    local label=\$1; shift
    echo "=== \$label" >> "\$LOGS/\$SUITE.log"
    "\$@" >> "\$LOGS/\$SUITE.log" 2>&1
    echo "\$label: exit \$?"
}
check() {
    local label=\$1; shift
    if "\$@" >> "\$LOGS/\$SUITE.log" 2>&1; then echo "CHECK PASS \$label" | tee -a "\$LOGS/\$SUITE.log"
    else echo "CHECK FAIL \$label" | tee -a "\$LOGS/\$SUITE.log"; fi
}
fails_with() {  # LOG PATTERN REPOSITORY [ARGS]: the server must refuse to start, saying PATTERN
    local log=\$1 pattern=\$2; shift 2
    serve "\$log" --model-repository="\$@"
    case \$? in
        0) stop; return 1 ;;  # it started
        2) return 1 ;;        # it neither started nor gave up
    esac
    grep -q -- "\$pattern" "\$log"
}
starts() {  # LOG REPOSITORY: the server starts (every model loads)
    local log=\$1; shift
    serve "\$log" --model-repository="\$@" || return 1
    stop
}
# Some tests wait on a queue with no timeout for a response that may never come (pytest-timeout
# cannot interrupt them: gRPC's threads take the signal). So each test runs in a pytest of its
# own, stopped after 150 s and then counted as failed; a unittest run is stopped after 30 minutes.
pt() {  # pytest, without its cache
    local id ids
    ids=\$("\$PY" -m pytest --collect-only -q -p no:cacheprovider "\$@" 2> /dev/null | grep '::')
    for id in \$ids; do
        # an id is relative to pytest's rootdir: ../test_infer_shm_leak.py is collected as test_infer_shm_leak.py
        [ -e "\${id%%::*}" ] || id="\$(dirname "\$1")/\$id"
        timeout -k 10 150 "\$PY" -m pytest -v -p no:cacheprovider "\$id"
        case \$? in 124|137) echo "FAILED \$id (no answer in 150 s)"; echo "=== 1 failed in 150.00s ===" ;; esac
    done
}
ut() {  # python -m unittest
    timeout -k 10 1800 "\$PY" -m unittest -v "\$@"
}
INNER

run_suite() {  # SUITE INNER_SCRIPT_BODY
    rm -f "$WORK/logs/$1.log"
    printf 'SUITE=%s\nsource %q\n%s\n' "$1" "$WORK/lib.sh" "$2" > "$WORK/$1.sh"
    unshare -rn bash "$WORK/$1.sh" || true
    # The totals: each pytest run is one test (pt), failed when its summary counts any failure
    # (subtests included); unittest's "Ran N tests" and "FAILED (...)"; and the checks.
    awk -v suite="$1" -v logf="$WORK/logs/$1.log" '
        /^Ran [0-9]+ test/ { ran += $2 }
        /^FAILED \(/ { while (match($0, /(failures|errors)=[0-9]+/)) {
            split(substr($0, RSTART, RLENGTH), kv, "="); bad += kv[2]; $0 = substr($0, RSTART + RLENGTH) } }
        /^=+ .* in [0-9.]+s/ { if ($0 ~ /[0-9]+ (failed|error)/) pbad++; else if ($0 ~ /[0-9]+ passed/) ok++ }
        /^CHECK PASS/ { cok++ } /^CHECK FAIL/ { cbad++ }
        END { printf "%s: %d passed, %d failed; checks: %d passed, %d failed (log: %s)\n",
              suite, ran - bad + ok, bad + pbad, cok, cbad, logf }
    ' "$WORK/logs/$1.log" | tee -a "$WORK/logs/summary.txt"
}

for suite in "${SUITES[@]}"; do
    "models_$suite"
    case $suite in
    python)
        run_suite python "
cd '$B'
serve inference_server.log --model-repository='$B/models' --allow-client-shm=true \
    --backend-config=python,shm-default-byte-size=5242880
t python_test pt python_test.py
stop
check multi_file starts multi_file.log '$B/checks/multi_file'
MY_ENV=MY_ENV check model_env starts model_env.log '$B/checks/model_env'
check init_exit fails_with init_exit.log 'failed to load' '$B/checks/init_exit'
check non_existent_model fails_with non_existent.log \"failed to load 'non_existent_model'\" '$B/checks/non_existent'
check non_existent_model_no_autocomplete fails_with non_existent_noauto.log \"failed to load 'non_existent_model'\" \
    '$B/checks/non_existent' --disable-auto-complete-config"
        ;;
    decoupled)
        run_suite decoupled "
cd '$B/decoupled'
serve decoupled_server.log --model-repository='$B/decoupled/models'
t decoupled_test pt decoupled_test.py
stop
for msg in 'Specific Msg!' 'Info Msg!' 'Warning Msg!' 'Error Msg!'; do check \"log \$msg\" grep -q \"\$msg\" decoupled_server.log; done
check 'Finalize invoked x3' test \$(grep -c 'Finalize invoked' decoupled_server.log) -eq 3
check 'Finalize complete x3' test \$(grep -c 'Finalize complete...' decoupled_server.log) -eq 3"
        ;;
    io)
        run_suite io "
cd '$B/io'
for trial in default decoupled; do
    export TRIAL=\$trial
    serve io_server.log --model-repository='$B/io/models.ensemble_'\$trial
    t \"test_ensemble_io \$trial\" pt io_test.py::IOTest::test_ensemble_io
    stop
done
serve io_server.log --model-repository='$B/io/models.empty_gpu_output'
t test_empty_gpu_output pt io_test.py::IOTest::test_empty_gpu_output
stop
serve io_server.log --model-repository='$B/io/models.variable_gpu_output'
t test_variable_gpu_output pt io_test.py::IOTest::test_variable_gpu_output
stop
serve io_server.log --model-repository='$B/io/models.requested_output'
t test_requested_output_default pt io_test.py::IOTest::test_requested_output_default
t test_requested_output_decoupled pt io_test.py::IOTest::test_requested_output_decoupled
stop
serve io_server.log --model-repository='$B/io/models.prior_crash'
t test_requested_output_decoupled_prior_crash pt io_test.py::IOTest::test_requested_output_decoupled_prior_crash
stop"
        ;;
    lifecycle)
        run_suite lifecycle "
cd '$B/lifecycle'
serve lifecycle_server.log --model-repository='$B/lifecycle/models'
t lifecycle_test pt lifecycle_test.py
stop
check init_error fails_with init_error.log \"name 'lorem_ipsum' is not defined\" '$B/lifecycle/checks/init_error'
starts fini_error.log '$B/lifecycle/checks/fini_error'
check fini_error grep -q \"name 'undefined_variable' is not defined\" fini_error.log
check auto_complete_error fails_with auto_complete_error.log \"name 'undefined_variable' is not defined\" \
    '$B/lifecycle/checks/auto_complete_error' --strict-model-config=false"
        ;;
    response_sender)
        run_suite response_sender "
cd '$B/response_sender'
serve response_sender_test.server.log --model-repository='$B/response_sender/models'
SERVER_LOG=response_sender_test.server.log t response_sender_test pt response_sender_test.py
stop
serve response_sender_complete_final_test.server.log --model-repository='$B/response_sender/models.complete_final'
SERVER_LOG=response_sender_complete_final_test.server.log t complete_final pt response_sender_complete_final_test.py
stop"
        ;;
    parameters)
        run_suite parameters "
cd '$B/parameters'
serve response_parameters_test.server.log --model-repository='$B/parameters/models'
t response_parameters_test pt response_parameters_test.py
stop"
        ;;
    ensemble)
        run_suite ensemble "
cd '$B/ensemble'
serve ensemble_server.log --model-repository='$B/ensemble/models'
t ensemble_test pt ensemble_test.py
stop"
        ;;
    bls)
        run_suite bls "
cd '$B/bls'
for trial in non_decoupled decoupled; do
    export BLS_KIND=\$trial
    serve bls_\$trial.server.log --model-repository='$B/bls/models' --cuda-memory-pool-byte-size=0:67108864
    for m in bls bls_memory bls_memory_async bls_async; do
        MODEL_NAME=\$m t \"\$m \$trial\" pt ../test_infer_shm_leak.py
    done
    stop
done
check bls_init_error fails_with bls_init_error.log \"BLS is only supported during the 'execute' function.\" \
    '$B/bls/checks/init_error'
starts bls_finalize_error.log '$B/bls/checks/finalize_error'
check bls_finalize_error grep -q \"BLS is only supported during the 'execute' function.\" bls_finalize_error.log
serve bls_parameters.server.log --model-repository='$B/bls/params_models'
t bls_parameters_test timeout -k 10 600 \"\$PY\" bls_parameters_test.py
stop"
        ;;
    model_control)
        run_suite model_control "
cd '$B/model_control'
serve model_control_server.log --model-repository='$B/model_control/models' --model-control-mode=explicit
t model_control_test pt model_control_test.py
stop"
        ;;
    argument_validation)
        run_suite argument_validation "
cd '$B/argument_validation'
serve arg_validation_server.log --model-repository='$B/argument_validation/models'
MODEL_NAME=argument_validation t argument_validation pt ../test_infer_shm_leak.py
stop"
        ;;
    model_readiness)
        run_suite model_readiness "
cd '$B/model_readiness'
serve readiness_server.log --model-repository='$B/model_readiness/models' --strict-readiness=false
t TestUserDefinedModelReadinessFunction ut test_model_readiness.TestUserDefinedModelReadinessFunction
t test_model_ready ut test_model_readiness.TestModelReadiness.test_model_ready
stop"
        ;;
    request_rescheduling)
        run_suite request_rescheduling "
cd '$B/request_rescheduling'
serve request_rescheduling_server.log --model-repository='$B/request_rescheduling/models' \
    --model-control-mode=explicit --load-model='*'
MODEL_NAME=bls_request_rescheduling t bls_request_rescheduling pt ../test_infer_shm_leak.py
t grpc_endpoint_test pt grpc_endpoint_test.py
stop"
        ;;
    async_execute)
        run_suite async_execute "
cd '$B/async_execute'
serve concurrency_test.server.log --model-repository='$B/async_execute/models'
SERVER_LOG=concurrency_test.server.log t concurrency_test pt concurrency_test.py
stop"
        ;;
    custom_metrics)
        run_suite custom_metrics "
cd '$B/custom_metrics'
serve custom_metrics_server.log --model-repository='$B/custom_metrics/models'
MODEL_NAME=custom_metrics t custom_metrics pt ../test_infer_shm_leak.py
stop"
        ;;
    *) echo "unknown suite: $suite" >&2; exit 2 ;;
    esac
done
