#!/bin/bash
# Run the tests of Triton's OpenAI-compatible frontend (python/openai/tests) against Conveyor's
# `conveyor openai-frontend` (see docs/COMPATIBILITY.md and docs/LLM.md).
#
#   deploy/triton_qa_openai.sh TRITON_SERVER_CHECKOUT [WORK_DIR [TEST_FILE...]]
#
# TEST_FILE: test_*.py names under python/openai/tests; default: the files served by the Python models
# of the tests' own repository (mock_llm, identity_py, tool_stream_py), then the vLLM ones. Each runs
# with pytest as it is; only tests/utils.py, the fixture, is replaced by deploy/triton_openai_fixture.py,
# which starts `conveyor openai-frontend` with main.py's flags instead of `python3 openai_frontend/main.py`
# (and runs Triton's in-process FastAPI fixtures as that group behind an ASGI app).
#
# TRITON_SERVER_CHECKOUT: a checkout (or `git archive`) of triton-inference-server/server. python/openai is
# copied into WORK_DIR (the tests import openai_frontend's request-size middleware by a relative path).
# The vLLM models the tests download (meta-llama/Meta-Llama-3.1-8B-Instruct, mistral-nemo, all-MiniLM)
# are stood in for by the tiny Llama of tests/support/tiny_llama.py, written into each model.json (and
# TEST_TOKENIZER); the tests then see a model of the same name with a tiny vocabulary.
# The async tests share one event loop per file (pytest-asyncio's asyncio_default_test_loop_scope): their
# class-scoped AsyncOpenAI clients keep connections of the loop they were made in, which pytest-asyncio 1.x
# closes after each test by default ("Event loop is closed"; Triton pins pytest-asyncio 0.23 and openai 1.x).
# Everything runs in a network namespace of its own (`unshare -rn`): the fixture's fixed ports
# (9000, 8000, 8001) disturb nothing else on the host.
#
# PYTHON (default: python) runs pytest; CONVEYOR_OPENAI_FRONTEND (default: `$PYTHON -m conveyor.deploy.cli
# openai-frontend`) is the program the fixture starts. TESTS_PYTHONPATH: folders put first on the path of the
# tests' process only, not the group's: Triton pins openai 1.107.3 (python/openai/requirements.txt), whose
# errors' text holds the whole body the tests look into (openai 2 and later write only `error.message`),
# while vLLM in the group needs the openai its own version requires. Per-file logs and JUnit XML land in
# WORK_DIR/logs.
set -euo pipefail
TRITON=$(realpath "$1")
WORK=$(realpath -m "${2:-$(mktemp -d)}")
shift $(( $# < 2 ? $# : 2 ))
FILES=("$@")
PY_FILES=(test_model_management.py test_observability.py test_request_size.py test_openai_restricted_apis.py)
VLLM_FILES=(test_completions.py test_chat_completions.py test_openai_client.py test_tool_calling.py test_lora.py
            test_embeddings.py)
[ ${#FILES[@]} -eq 0 ] && FILES=("${PY_FILES[@]}" "${VLLM_FILES[@]}")
PY=${PYTHON:-python}
case $PY in /*) ;; */*) PY=$PWD/$PY ;; *) PY=$(command -v "$PY") ;; esac  # the tests run elsewhere
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")

mkdir -p "$WORK/logs" "$WORK/stubs"
rm -rf "$WORK/openai"
cp -r "$TRITON/python/openai" "$WORK/openai"
T=$WORK/openai/tests
cp "$HERE/triton_openai_fixture.py" "$T/utils.py"
# The test files import tritonserver (Triton's in-process Python API) for its ModelControlMode enum and
# type hints only; the fixture runs no in-process server.
cat > "$WORK/stubs/tritonserver.py" <<'EOF'
"""Stand-in for Triton's in-process API: what python/openai/tests import from it."""
import enum


class ModelControlMode(enum.Enum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


class Server:
    """Type hints only: the fixture starts `conveyor openai-frontend` instead."""
EOF

# The tiny Llama in place of every model the vLLM folders name.
TINY=$WORK/tiny_llama
PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} "$PY" - "$TINY" "$T" <<'EOF'
import json, sys
from pathlib import Path
from tests.support import tiny_llama
tiny = tiny_llama.build(Path(sys.argv[1]))
for model_json in Path(sys.argv[2]).glob("vllm*/*/1/model.json"):
    args = json.loads(model_json.read_text())
    args.update(model=str(tiny.model_dir), enforce_eager=True, dtype="float32", max_model_len=256,
                max_num_seqs=16, kv_cache_memory_bytes=64 << 20)
    args.pop("gpu_memory_utilization", None)
    if model_json.parts[-4] == "vllm_embedding_models":
        args["runner"] = "pooling"  # all-MiniLM is an embedding model: the tiny Llama pools in its place
    model_json.write_text(json.dumps(args, indent=2))
print(tiny.model_dir)
EOF

export TEST_TOKENIZER=$TINY/model
GROUP_PATH=${PYTHONPATH:-}
export CONVEYOR_OPENAI_FRONTEND=${CONVEYOR_OPENAI_FRONTEND:-"env PYTHONPATH=$GROUP_PATH $PY -m conveyor.deploy.cli openai-frontend"}
export PYTHONPATH=${TESTS_PYTHONPATH:+$TESTS_PYTHONPATH:}$WORK/stubs${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_TARGET_DEVICE=${VLLM_TARGET_DEVICE:-cpu}
status=0
for f in "${FILES[@]}"; do
    name=${f%.py}
    echo "=== $f"
    (cd "$WORK/openai" && unshare -rn bash -c 'ip link set lo up 2>/dev/null || true; exec "$@"' _ \
        "$PY" -m pytest -p no:cacheprovider -q -o asyncio_default_test_loop_scope=module "tests/$f" \
        --junitxml="$WORK/logs/$name.xml" \
        >"$WORK/logs/$name.log" 2>&1) || status=1
    tail -1 "$WORK/logs/$name.log"
done
exit $status
