#!/bin/bash
# Run tritonclient's own Python example clients against `conveyor serve` (see docs/COMPATIBILITY.md).
#
#   deploy/triton_client_examples.sh EXAMPLES_DIR [WORK_DIR [EXAMPLE...]]
#
# EXAMPLES_DIR: the client repository's src/python/examples (or a checkout of
# triton-inference-server/client, whose src/python/examples is then used). The example files are
# run where they are, unchanged, and never copied into this repository. EXAMPLE: file names
# (simple_http_infer_client.py ...) to run only those; by default every example whose models can
# be served here, as Triton's qa/L0_http and qa/L0_grpc run them (with -v, passed when it exits 0
# and prints its PASS line where it has one).
#
# The models are those of Triton's docs/examples/model_repository and a few more, made by
# conveyor.deploy.client_examples_repo (nothing downloaded). The examples talk to
# localhost:8000/8001, so the servers and the examples run in a network namespace of their own
# (`unshare -rn`): nothing else on the host is touched. Needs onnx and tritonclient[all].
#
# Not run: the CUDA shared-memory examples (a GPU), image_client.py, grpc_image_client.py and
# ensemble_image_client.py (they check a real classifier's answer, whose weights are a download),
# and simple_grpc_keepalive_client.py against the default gRPC server (run, it is; it needs
# the grpc.aio server for keepalive, which the script starts with the keepalive flags).
set -euo pipefail
EX=$(realpath "$1")
[ -d "$EX/src/python/examples" ] && EX=$EX/src/python/examples
WORK=$(realpath -m "${2:-$(mktemp -d)}")
shift $(( $# < 2 ? $# : 2 ))
ONLY=" $* "
PY=${PYTHON:-python}
case $PY in /*) ;; */*) PY=$PWD/$PY ;; *) PY=$(command -v "$PY") ;; esac  # the examples run elsewhere
mkdir -p "$WORK/logs"

# The models: every one in WORK/models; for each model-control example a repository with as many
# models as it counts in the index (simple and the docs' others), served in explicit mode.
rm -rf "$WORK/models" "$WORK"/control_*
"$PY" -m conveyor.deploy.client_examples_repo "$WORK/models"
for f in simple_http_model_control.py simple_grpc_model_control.py; do
    [ -f "$EX/$f" ] || continue
    n=$(grep -oE 'get_model_repository_index\(\)(\.models)?\) != [0-9]+' "$EX/$f" | grep -oE '[0-9]+$' || echo 8)
    names=$("$PY" -c "from conveyor.deploy.client_examples_repo import DOCS_MODELS as m
print(' '.join((['simple'] + [x for x in m if x != 'simple'])[:$n]))")
    "$PY" -m conveyor.deploy.client_examples_repo "$WORK/control_${f%.py}" $names
done

cat > "$WORK/inner.sh" <<INNER
set -u
ip link set lo up
PY="$PY"; EX="$EX"; WORK="$WORK"; ONLY="$ONLY"
LOGS="\$WORK/logs"
passed=0; failed=0; server=0
serve() {
    "\$PY" -m conveyor.deploy.cli serve --group ex\$\$ "\$@" >> "\$LOGS/server.log" 2>&1 &
    server=\$!
    for _ in \$(seq 1 240); do
        curl -sf localhost:8000/v2/health/ready > /dev/null && break
        kill -0 \$server 2> /dev/null || { echo "the server exited: see \$LOGS/server.log"; break; }
        sleep 0.5
    done
}
stop() { kill -TERM \$server; wait \$server; server=0; }
# t FILE ARGS...: run one example as Triton's QA does; passed when it exits 0 and prints PASS
# where the file has a PASS line.
t() {
    local f=\$1; shift
    local label="\$f\${1:+ \$*}"
    [ "\$ONLY" = "  " ] || [[ "\$ONLY" == *" \$f "* ]] || return 0
    [ -f "\$EX/\$f" ] || { echo "\$label: absent"; return 0; }
    local log="\$LOGS/\${f%.py}\$(echo "\$*" | tr -c 'a-zA-Z0-9\n' _).log"
    (cd "\$EX" && timeout -k 5 120 "\$PY" "\$f" "\$@") > "\$log" 2>&1
    local rc=\$?
    if [ \$rc -eq 0 ] && { ! grep -q PASS "\$EX/\$f" || grep -q PASS "\$log"; }; then
        echo "\$label: passed"; passed=\$((passed + 1))
    else
        echo "\$label: FAILED (exit \$rc, log: \$log)"; failed=\$((failed + 1))
    fi
}

serve --model-repository="\$WORK/models" --allow-client-shm=true
for f in simple_http_health_metadata.py simple_grpc_health_metadata.py \
         simple_http_infer_client.py simple_grpc_infer_client.py \
         simple_http_async_infer_client.py simple_grpc_async_infer_client.py \
         simple_http_aio_infer_client.py simple_grpc_aio_infer_client.py \
         simple_http_string_infer_client.py simple_grpc_string_infer_client.py \
         simple_http_shm_client.py simple_grpc_shm_client.py \
         simple_http_shm_string_client.py simple_grpc_shm_string_client.py \
         simple_http_sequence_sync_infer_client.py simple_grpc_sequence_sync_infer_client.py \
         simple_grpc_sequence_stream_infer_client.py simple_grpc_aio_sequence_stream_infer_client.py \
         simple_grpc_custom_args_client.py simple_grpc_custom_repeat.py \
         grpc_explicit_byte_content_client.py grpc_explicit_int_content_client.py \
         grpc_explicit_int8_content_client.py grpc_client.py; do
    t \$f -v
done
# The dyna sequence models (-d), with correlation IDs of their own (-o).
t simple_grpc_sequence_stream_infer_client.py -v -d -o 10
t simple_grpc_aio_sequence_stream_infer_client.py -v -d -o 20
t simple_grpc_sequence_sync_infer_client.py -v -d -o 30
t simple_http_sequence_sync_infer_client.py -v -d -o 40
t reuse_infer_objects_client.py -v -i http -u localhost:8000
t reuse_infer_objects_client.py -v -i grpc -u localhost:8001
t memory_growth_test.py -i http -r 20
t memory_growth_test.py -i grpc -r 20
t simple_grpc_keepalive_client.py -v
stop
for c in simple_http_model_control simple_grpc_model_control; do
    [ -d "\$WORK/control_\$c" ] || continue
    serve --model-repository="\$WORK/control_\$c" --model-control-mode=explicit
    t \$c.py -v
    stop
done
echo "client examples: \$passed passed, \$failed failed (logs: \$LOGS)"
[ \$failed -eq 0 ]
INNER
unshare -rn bash "$WORK/inner.sh"
