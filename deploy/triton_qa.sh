#!/bin/bash
# Run Triton's own QA test files against `conveyor serve` (see docs/COMPATIBILITY.md).
#
#   deploy/triton_qa.sh TRITON_SERVER_CHECKOUT [WORK_DIR [SUITE...]]
#
# SUITE: http (the default), grpc, input_validation, shared_memory, or all. Each runs the
# Python test files of Triton's qa/L0_<suite> that need no GPU, no TensorRT and no other
# repository, with the models its test.sh makes where they can be made here.
#
# TRITON_SERVER_CHECKOUT: a checkout (or `git archive`) of triton-inference-server/server with
# qa/ and docs/. Its files are used where they are, never copied into this repository (the
# shared-memory and input-validation tests write their result files next to themselves). The
# test files talk to localhost:8000/8001, so the servers and the tests run in a network
# namespace of their own (`unshare -rn`): nothing else on the host is touched. Needs onnx,
# tritonclient, requests, pytest, psutil (shared memory) and torch (input validation's pt_identity).
set -euo pipefail
TRITON=$(realpath "$1")
WORK=$(realpath -m "${2:-$(mktemp -d)}")
shift $(( $# < 2 ? $# : 2 ))
SUITES=("$@")
[ ${#SUITES[@]} -eq 0 ] && SUITES=(http)
[ "${SUITES[0]}" = all ] && SUITES=(http grpc input_validation shared_memory)
PY=${PYTHON:-python}
case $PY in /*) ;; */*) PY=$PWD/$PY ;; *) PY=$(command -v "$PY") ;; esac  # the tests run elsewhere
QA=$TRITON/qa
EXAMPLES=$TRITON/docs/examples/model_repository
mkdir -p "$WORK"

# --- models, made outside the namespace ----------------------------------------------------

identity_models() {  # qa/common/gen_qa_identity_models.py --onnx, once
    [ -d "$WORK/ident" ] || (cd "$QA/common" && "$PY" gen_qa_identity_models.py --onnx --models_dir "$WORK/ident" >/dev/null)
}

qa_models() {  # qa/common/gen_qa_models.py --onnx (Triton's qa_model_repository), once
    [ -d "$WORK/qa_repo" ] || (cd "$QA/common" && "$PY" gen_qa_models.py --onnx --models_dir "$WORK/qa_repo" >/dev/null)
}

python_model() {  # DEST NAME SRC_DIR: a qa/python_models model laid out as a repository entry
    mkdir -p "$1/$2/1"
    cp "$3/model.py" "$1/$2/1/"
    cp "$3/config.pbtxt" "$1/$2/"
}

models_http() {  # as qa/L0_http/test.sh makes them (its "python unit test" section)
    local M=$WORK/http/models
    rm -rf "$M" && mkdir -p "$M"
    identity_models
    for m in onnx_zero_1_float32 onnx_zero_1_object onnx_zero_1_float16 onnx_zero_3_float32; do
        cp -r "$WORK/ident/$m" "$M/"
    done
    cp -r "$M/onnx_zero_1_object" "$M/onnx_zero_1_object_1_element"
    sed -i "s/onnx_zero_1_object/onnx_zero_1_object_1_element/; 0,/-1/{s/-1/1/}" \
        "$M/onnx_zero_1_object_1_element/config.pbtxt"
    cp -r "$M/onnx_zero_1_float32" "$M/onnx_zero_1_float32_queue"
    sed -i "s/onnx_zero_1_float32/onnx_zero_1_float32_queue/" "$M/onnx_zero_1_float32_queue/config.pbtxt"
    printf 'dynamic_batching {\n max_queue_delay_microseconds: 1000000\n preferred_batch_size: [ 8 ]\n default_queue_policy { max_queue_size: 1 }\n}\n' \
        >> "$M/onnx_zero_1_float32_queue/config.pbtxt"
    cp -r "$EXAMPLES/simple_identity" "$M/"
    cp -r "$M/simple_identity" "$M/simple_identity_int64"
    sed -i "s/TYPE_STRING/TYPE_INT64/; s/simple_identity/simple_identity_int64/" "$M/simple_identity_int64/config.pbtxt"
}

standin_onnx() {  # DIR INPUT IN_SHAPE OUTPUT OUT_SHAPE: DIR/1/model.onnx, the input's first elements as the output
    mkdir -p "$1/1"
    "$PY" - "$@" <<'EOF'
import sys
import onnx
from onnx import TensorProto, helper
d, iname, ishape, oname, oshape = sys.argv[1:]
ishape, oshape = [int(x) for x in ishape.split(",")], [int(x) for x in oshape.split(",")]
n = 1
for dim in oshape:
    n *= dim
ints = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [len(v)], v)
graph = helper.make_graph(
    [helper.make_node("Flatten", [iname], ["flat"], axis=0),
     helper.make_node("Slice", ["flat", "starts", "ends", "axes"], ["first"]),
     helper.make_node("Reshape", ["first", "shape"], [oname])],
    "standin", [helper.make_tensor_value_info(iname, TensorProto.FLOAT, ishape)],
    [helper.make_tensor_value_info(oname, TensorProto.FLOAT, oshape)],
    [ints("starts", [0]), ints("ends", [n]), ints("axes", [1]), ints("shape", oshape)])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), f"{d}/1/model.onnx")
EOF
}

models_grpc() {  # qa/L0_grpc/test.sh: MODELDIR (the docs' examples), its grpc_test_models, client_plugin_models
    local D=$WORK/grpc
    rm -rf "$D" && mkdir -p "$D/grpc_test_models"
    # densenet_onnx and inception_onnx: fetch_models.sh downloads their model files; stand-ins
    # with the same signature take their place (the aio test's index count, 8, counts them).
    cp -r "$EXAMPLES" "$D/models"
    standin_onnx "$D/models/densenet_onnx" data_0 1,3,224,224 fc6_1 1,1000,1,1
    standin_onnx "$D/models/inception_onnx" input:0 1,299,299,3 InceptionV3/Predictions/Softmax:0 1,1001
    cp -r "$EXAMPLES/simple" "$D/grpc_test_models/"
    python_model "$D/grpc_test_models" string_identity "$QA/python_models/string_identity"
    sed -i "s/dims: \[ 1 \]/dims: [ -1 ]/g" "$D/grpc_test_models/string_identity/config.pbtxt"
    cp -r "$QA/L0_grpc/client_plugin_models" "$D/"
}

models_input_validation() {  # qa/L0_input_validation/test.sh, but its TensorRT shape-tensor models
    local D=$WORK/input_validation
    rm -rf "$D" && mkdir -p "$D/empty"
    cp -r "$QA/L0_input_validation/models" "$D/models"
    mkdir -p "$D/models/pt_identity/1"
    "$PY" -c "import torch; torch.jit.save(torch.jit.script(torch.nn.Identity()), '$D/models/pt_identity/1/model.pt')"
    cat > "$D/models/pt_identity/config.pbtxt" <<EOL
name: "pt_identity"
backend: "pytorch"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [8] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [8] } ]
dynamic_batching { max_queue_delay_microseconds: 1000000 }
EOL
    qa_models
    cp -r "$WORK/qa_repo/onnx_object_int32_int32" "$D/models/"
}

models_shared_memory() {  # qa/L0_shared_memory/test.sh: simple, the delayed python simple, add_sub per backend
    local D=$WORK/shared_memory
    rm -rf "$D" && mkdir -p "$D/models" "$D/python_models" "$D/offset_models"
    cp -r "$EXAMPLES/simple" "$D/models/"
    python_model "$D/python_models" simple "$QA/python_models/execute_delayed_model"
    python_model "$D/offset_models" python_int32_int32_int32 "$QA/python_models/add_sub"
    sed -i 's/TYPE_FP32/TYPE_INT32/g' "$D/offset_models/python_int32_int32_int32/config.pbtxt"
    echo "max_batch_size: 8" >> "$D/offset_models/python_int32_int32_int32/config.pbtxt"
    qa_models
    # As test.sh: version 1 only (versions 2 and 3 swap the outputs).
    mkdir -p "$D/offset_models/onnx_int32_int32_int32"
    cp -r "$WORK/qa_repo/onnx_int32_int32_int32/"{1,config.pbtxt,output0_labels.txt} "$D/offset_models/onnx_int32_int32_int32/"
}

# --- the runs, inside the namespace --------------------------------------------------------

# Helpers for the inner scripts: serve MODELS ARGS... starts a group and waits until it is
# ready; stop ends it; t LABEL CMD... runs one test command and keeps its output.
cat > "$WORK/lib.sh" <<INNER
set -u
ip link set lo up
PY="$PY"
LOGS="$WORK/logs"
mkdir -p "\$LOGS"
server=0
serve() {
    local models=\$1; shift
    "\$PY" -m conveyor.deploy.cli serve --group qa\$\$ --model-repository "\$models" "\$@" \
        >> "\$LOGS/server.log" 2>&1 &
    server=\$!
    for _ in \$(seq 1 240); do
        curl -sf localhost:8000/v2/health/live > /dev/null && break
        kill -0 \$server 2> /dev/null || { echo "the server exited: see \$LOGS/server.log"; break; }
        sleep 0.5
    done
    for _ in \$(seq 1 60); do curl -sf localhost:8000/v2/health/ready > /dev/null && break; sleep 0.5; done
}
stop() { kill -TERM \$server; wait \$server; server=0; }
t() {
    local label=\$1; shift
    echo "=== \$label" >> "\$LOGS/\$SUITE.log"
    "\$@" >> "\$LOGS/\$SUITE.log" 2>&1
    echo "\$label: exit \$?"
}
INNER

run_suite() {  # SUITE INNER_SCRIPT_BODY
    rm -f "$WORK/logs/$1.log"
    printf 'SUITE=%s\nsource %q\n%s\n' "$1" "$WORK/lib.sh" "$2" > "$WORK/$1.sh"
    unshare -rn bash "$WORK/$1.sh"
    # The totals of each run: unittest's "Ran N tests" and "FAILED (failures=F, errors=E)",
    # pytest's "N passed, M failed".
    awk -v suite="$1" -v logf="$WORK/logs/$1.log" '
        /^Ran [0-9]+ test/ { ran += $2 }
        /^FAILED \(/ { while (match($0, /(failures|errors)=[0-9]+/)) {
            split(substr($0, RSTART, RLENGTH), kv, "="); bad += kv[2]; $0 = substr($0, RSTART + RLENGTH) } }
        /^=+ .* in [0-9.]+s/ { if (match($0, /[0-9]+ passed/)) ok += substr($0, RSTART, RLENGTH) + 0
                               if (match($0, /[0-9]+ failed/)) pbad += substr($0, RSTART, RLENGTH) + 0 }
        END { printf "%s: %d passed, %d failed (log: %s)\n", suite, ran - bad + ok, bad + pbad, logf }
    ' "$WORK/logs/$1.log"
}

for suite in "${SUITES[@]}"; do
    "models_$suite"
    case $suite in
    http)
        run_suite http "
serve '$WORK/http/models' --model-control-mode=explicit --load-model='*'
cd '$QA/L0_http' && t http_test \"\$PY\" -m unittest -v http_test
stop"
        ;;
    grpc)
        run_suite grpc "
cd '$QA/L0_grpc'
serve '$WORK/grpc/grpc_test_models'
t GrpcTest \"\$PY\" -m unittest -v python_unit_test.GrpcTest
stop
serve '$WORK/grpc/models' --allow-client-shm=true
t aio \"\$PY\" -m unittest -v python_grpc_aio_test
stop
serve '$WORK/grpc/client_plugin_models' --http-header-forward-pattern='.*' --grpc-header-forward-pattern='.*'
t plugin \"\$PY\" -m unittest -v grpc_client_plugin_test
stop
serve '$WORK/grpc/models' \
    --grpc-restricted-protocol=model-repository:admin-key=admin-value \
    --grpc-restricted-protocol=inference,health:infer-key=infer-value
t RestrictedProtocolTest \"\$PY\" -m unittest -v python_unit_test.RestrictedProtocolTest
stop"
        ;;
    input_validation)
        run_suite input_validation "
cd '$QA/L0_input_validation'
serve '$WORK/input_validation/models' --allow-client-shm=true
t InputValTest \"\$PY\" -m pytest -v -p no:cacheprovider input_validation_test.py::InputValTest
t InputShapeTest \"\$PY\" -m pytest -v -p no:cacheprovider input_validation_test.py::InputShapeTest
stop
serve '$WORK/input_validation/empty' --model-control-mode=explicit
t ModelNameValidationTest \"\$PY\" -m pytest -v -p no:cacheprovider input_validation_test.py::ModelNameValidationTest
stop"
        ;;
    shared_memory)
        # test.sh starts a server per test; here one per protocol does, and every region is
        # unregistered between tests (each test registers the same names).
        cases="test_invalid_create_shm test_valid_create_set_register test_unregister_before_register
            test_unregister_after_register test_reregister_after_register test_unregister_after_inference
            test_register_after_inference test_too_big_shm test_mixed_raw_shm test_unregisterall
            test_infer_offset_out_of_bound test_infer_byte_size_out_of_bound test_infer_integer_overflow
            test_register_out_of_bound test_register_reserved_names test_register_invalid_shm_key"
        cases=$(echo $cases)  # one line
        run_suite shared_memory "
cd '$QA/L0_shared_memory'
for p in http grpc; do
    export CLIENT_TYPE=\$p
    serve '$WORK/shared_memory/models' --allow-client-shm=false
    t \"disabled \$p\" \"\$PY\" -m unittest -v shared_memory_test.SharedMemoryTest.test_client_shm_disabled_by_default
    stop
    serve '$WORK/shared_memory/models' --allow-client-shm=true
    for c in $cases; do
        t \"\$c \$p\" \"\$PY\" -m unittest -v shared_memory_test.SharedMemoryTest.\$c
        curl -sf -X POST localhost:8000/v2/systemsharedmemory/unregister > /dev/null
    done
    stop
    serve '$WORK/shared_memory/python_models' --allow-client-shm=true
    for c in test_unregister_shm_during_inference_single_req test_unregister_shm_during_inference_multiple_req \
             test_unregister_shm_after_inference; do
        t \"\$c \$p\" \"\$PY\" -m unittest -v shared_memory_test.TestSharedMemoryUnregister.\${c}_\$p
        curl -sf -X POST localhost:8000/v2/systemsharedmemory/unregister > /dev/null
    done
    stop
    serve '$WORK/shared_memory/offset_models' --allow-client-shm=true
    BACKENDS='python onnx' t \"test_large_shm_register_offset \$p\" \
        \"\$PY\" -m unittest -v shared_memory_test.SharedMemoryTest.test_large_shm_register_offset
    stop
done"
        ;;
    *) echo "unknown suite: $suite" >&2; exit 2 ;;
    esac
done
