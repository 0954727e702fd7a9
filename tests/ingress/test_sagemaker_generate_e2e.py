"""SageMaker's ``/invocations`` as Triton's generate endpoints
(``SAGEMAKER_TRITON_INFERENCE_TYPE=generate`` / ``generate_stream``), driven with plain
HTTP as SageMaker calls it; and an unknown type refused at start, as Triton's
SageMaker entry point refuses it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from conveyor.deploy.example_repo import add_sub
from conveyor.deploy.ports import free_port
from tests.support.cloud_http import A, B, call
from tests.support.group import wait_ready

LEVEL = "e2e"

SUMS = [a + b for a, b in zip(A, B, strict=True)]
DIFFS = [a - b for a, b in zip(A, B, strict=True)]


def _serve(repo: str, group: str, inference_type: str, ports: list[int]) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIP_", "SAGEMAKER_"))}
    env.update(SAGEMAKER_TRITON_INFERENCE_TYPE=inference_type, SAGEMAKER_TRITON_DEFAULT_MODEL_NAME="simple")
    return subprocess.Popen([
        sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", repo, "--group", group,
        "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--workers", "1",
        "--arena-size", str(32 << 20), "--exit-timeout-secs", "10", "--drain-grace-secs", "0",
        "--allow-sagemaker", "true", "--sagemaker-port", str(ports[3]),
    ], env=env, stderr=subprocess.PIPE if inference_type not in ("generate", "generate_stream") else None)


@pytest.fixture(scope="module", params=["generate", "generate_stream"])
def sagemaker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    repo = str(tmp_path_factory.mktemp("smgen"))
    add_sub(repo, "simple", 0)
    ports = [free_port() for _ in range(4)]
    proc = _serve(repo, f"smg{os.getpid()}{request.param[-1]}", request.param, ports)
    try:
        wait_ready(ports[0], proc, (ports[3],))
        yield request.param, ports[3]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def _events(body: bytes) -> list[dict[str, object]]:
    chunks = body.decode().split("\n\n")
    assert chunks[-1] == ""  # every event ends with a blank line
    assert all(c.startswith("data: ") for c in chunks[:-1]), body
    return [json.loads(c[len("data: "):]) for c in chunks[:-1]]


def test_invocations_answer_as_the_generate_endpoint(sagemaker: tuple[str, int]) -> None:
    kind, port = sagemaker
    status, headers, body = call(port, "/invocations", json.dumps({"INPUT0": A, "INPUT1": B}).encode(),
                                 headers={"Content-Type": "application/json"})
    assert status == 200
    if kind == "generate":
        assert headers["content-type"].startswith("application/json")
        doc = json.loads(body)
    else:
        assert headers["content-type"] == "text/event-stream; charset=utf-8"
        [doc] = _events(body)
    assert (doc["model_name"], doc["OUTPUT0"], doc["OUTPUT1"]) == ("simple", SUMS, DIFFS)


def test_a_bad_generate_request_keeps_the_generate_endpoints_words(sagemaker: tuple[str, int]) -> None:
    _, port = sagemaker
    status, _, body = call(port, "/invocations", json.dumps({"INPUT0": A}).encode())
    assert status == 400
    assert json.loads(body)["error"].startswith(
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'simple'")


def test_an_unknown_inference_type_is_refused_at_start(tmp_path: str) -> None:
    ports = [free_port() for _ in range(4)]
    proc = _serve(str(tmp_path), f"smbad{os.getpid()}", "predict", ports)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert ("Invalid SAGEMAKER_TRITON_INFERENCE_TYPE 'predict'. Must be one of: infer, generate, "
            "generate_stream") in err.decode()
