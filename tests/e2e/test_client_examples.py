"""tritonclient's own example clients, run unchanged against a running group.

A handful of the client repository's ``src/python/examples`` are vendored (with their license
headers) in tests/support/data/client_examples; ``CONVEYOR_CLIENT_EXAMPLES`` points the test at a
checkout's examples folder instead. deploy/triton_client_examples.sh runs all of them
(docs/COMPATIBILITY.md). An example passes as in Triton's QA: it exits 0 and prints its PASS line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from conveyor.deploy import client_examples_repo
from tests.support.group import Server, start_server

LEVEL = "e2e"

VENDORED = os.path.join(os.path.dirname(__file__), os.pardir, "support", "data", "client_examples")
EXAMPLES = os.environ.get("CONVEYOR_CLIENT_EXAMPLES") or VENDORED


def run_example(name: str, url: str, *args: str) -> str:
    path = os.path.join(EXAMPLES, name)
    if not os.path.exists(path):
        pytest.skip(f"{name} is not in {EXAMPLES}")
    done = subprocess.run([sys.executable, path, "-u", url, *args], capture_output=True, text=True, timeout=60,
                          cwd=EXAMPLES, env={**os.environ, "PYTHONPATH": ""})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    with open(path, encoding="utf-8") as f:
        if "PASS" in f.read():
            assert "PASS" in out, out
    return out


@pytest.fixture(scope="module")
def examples_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = client_examples_repo.build(str(tmp_path_factory.mktemp("examples")),
                                      ["simple", "simple_string", "simple_identity", "simple_sequence"])
    srv = start_server(repo, f"ex{os.getpid()}", "--workers", "1", "--allow-client-shm", "true")
    yield srv
    assert srv.stop() == 0


@pytest.mark.parametrize(("name", "protocol"), [
    ("simple_http_infer_client.py", "http"),  # plain and binary tensors, requested outputs
    ("simple_http_shm_client.py", "http"),  # system shared memory, registered and used
    ("simple_grpc_string_infer_client.py", "grpc"),  # BYTES: ONNX strings and a Python identity
    ("simple_grpc_sequence_stream_infer_client.py", "grpc"),  # a stream of sequences, a UUID string ID
    ("simple_grpc_aio_infer_client.py", "grpc"),  # grpc.aio's client
])
def test_example_passes(examples_server: Server, name: str, protocol: str) -> None:
    run_example(name, examples_server.http_url if protocol == "http" else examples_server.grpc_url)


def test_model_control_example(tmp_path: str) -> None:
    """Explicit mode as the example expects it: its repository index counts Triton's eight example
    models; it loads, reloads with a config override, unloads, and checks the errors' words."""
    repo = client_examples_repo.build(str(tmp_path), client_examples_repo.DOCS_MODELS)
    srv = start_server(repo, f"exmc{os.getpid()}", "--workers", "1", "--model-control-mode", "explicit")
    try:
        run_example("simple_grpc_model_control.py", srv.grpc_url)
    finally:
        assert srv.stop() == 0
