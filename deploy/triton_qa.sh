#!/bin/bash
# Run Triton's own qa/L0_http/http_test.py against `conveyor serve` (see docs/COMPATIBILITY.md).
#
#   deploy/triton_qa.sh TRITON_SERVER_CHECKOUT [WORK_DIR]
#
# TRITON_SERVER_CHECKOUT: a checkout (or `git archive`) of triton-inference-server/server with
# qa/ and docs/. Its files are used where they are, never copied into this repository. The test
# file talks to localhost:8000, so the server and the test run in a network namespace of their
# own (`unshare -rn`): nothing else on the host is touched. Needs onnx, tritonclient, requests.
set -euo pipefail
TRITON=$(realpath "$1")
WORK=$(realpath -m "${2:-$(mktemp -d)}")
PY=${PYTHON:-python}
MODELS=$WORK/models
rm -rf "$MODELS" && mkdir -p "$WORK/ident" "$MODELS"

# The models, as qa/L0_http/test.sh makes them (its "python unit test" section).
(cd "$TRITON/qa/common" && "$PY" gen_qa_identity_models.py --onnx --models_dir "$WORK/ident" >/dev/null)
for m in onnx_zero_1_float32 onnx_zero_1_object onnx_zero_1_float16 onnx_zero_3_float32; do
    cp -r "$WORK/ident/$m" "$MODELS/"
done
cp -r "$MODELS/onnx_zero_1_object" "$MODELS/onnx_zero_1_object_1_element"
sed -i "s/onnx_zero_1_object/onnx_zero_1_object_1_element/; 0,/-1/{s/-1/1/}" \
    "$MODELS/onnx_zero_1_object_1_element/config.pbtxt"
cp -r "$MODELS/onnx_zero_1_float32" "$MODELS/onnx_zero_1_float32_queue"
sed -i "s/onnx_zero_1_float32/onnx_zero_1_float32_queue/" "$MODELS/onnx_zero_1_float32_queue/config.pbtxt"
printf 'dynamic_batching {\n max_queue_delay_microseconds: 1000000\n preferred_batch_size: [ 8 ]\n default_queue_policy { max_queue_size: 1 }\n}\n' \
    >> "$MODELS/onnx_zero_1_float32_queue/config.pbtxt"
cp -r "$TRITON/docs/examples/model_repository/simple_identity" "$MODELS/"
cp -r "$MODELS/simple_identity" "$MODELS/simple_identity_int64"
sed -i "s/TYPE_STRING/TYPE_INT64/; s/simple_identity/simple_identity_int64/" "$MODELS/simple_identity_int64/config.pbtxt"

cat > "$WORK/run.sh" <<INNER
set -u
ip link set lo up
"$PY" -m conveyor.deploy.cli serve --group qa\$\$ --model-repository "$MODELS" \
    --model-control-mode=explicit --load-model='*' > "$WORK/server.log" 2>&1 &
server=\$!
for _ in \$(seq 1 240); do curl -sf localhost:8000/v2/health/ready > /dev/null && break; sleep 0.5; done
cd "$TRITON/qa/L0_http" && "$PY" http_test.py
status=\$?
kill -TERM \$server; wait \$server
exit \$status
INNER
unshare -rn bash "$WORK/run.sh"
