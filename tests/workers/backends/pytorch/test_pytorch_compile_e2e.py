"""``conveyor.torch_compile`` through the real process group: a compiled TorchScript
model answers tritonclient over HTTP and gRPC as the TorchScript module does, and a
model that cannot compile is served uncompiled (``auto``) or unavailable with the
reason (``true``). One server for the module: compiling is slow."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.group import Server, start_server

LEVEL = "e2e"

torch = pytest.importorskip("torch", reason="torch is not installed (pip install conveyor[torch])")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support import torch_models

    path = tmp_path_factory.mktemp("compiled")
    torch_models.build_compiled(str(path))
    return path


@pytest.fixture(scope="module")
def compiled_server(repo: Path) -> Iterator[Server]:
    srv = start_server(str(repo), f"tc{os.getpid()}", "--workers", "1")
    yield srv
    assert srv.stop() == 0
    assert srv.shm_segments() == []


@pytest.fixture(params=["http", "grpc"])
def connect(request: pytest.FixtureRequest, compiled_server: Server) -> Callable[[], Any]:
    """A new client (the HTTP client may not be shared between threads)."""
    if request.param == "http":
        return lambda: httpclient.InferenceServerClient(compiled_server.http_url)
    return lambda: grpcclient.InferenceServerClient(compiled_server.grpc_url)


@pytest.fixture()
def client(connect: Callable[[], Any]) -> Any:
    return connect()


def _protocol(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def _infer(client: Any, model: str, x: np.ndarray, outputs: int = 1) -> list[np.ndarray]:
    inp = _protocol(client).InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp])
    return [result.as_numpy(f"OUTPUT__{i}") for i in range(outputs)]


def test_compiled_model_answers_as_torchscript_does(connect: Callable[[], Any], repo: Path) -> None:
    eager = torch.jit.load(str(repo / "torch_compiled" / "1" / "model.pt"))

    def one(rows: int) -> None:
        x = np.random.default_rng(rows).random((rows, 4), dtype=np.float32)
        got = _infer(connect(), "torch_compiled", x, outputs=2)
        with torch.no_grad():
            want = eager(torch.from_numpy(x))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-6)

    with ThreadPoolExecutor(4) as pool:  # concurrent requests: batches of several sizes
        list(pool.map(one, [1, 3, 2, 5, 1, 4, 2, 1]))


def test_auto_serves_a_model_that_cannot_compile_uncompiled(client: Any) -> None:
    x = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    want = x.copy()
    while np.abs(want).sum() < 100:
        want = want * 2 + 1
    np.testing.assert_array_equal(_infer(client, "torch_compile_auto", x)[0], want)


def test_compile_failures_and_bad_parameters_say_why(client: Any) -> None:
    assert not client.is_model_ready("torch_compile_strict")
    with pytest.raises(InferenceServerException, match=r"could not convert the TorchScript module .*prim::Loop"):
        client.get_model_metadata("torch_compile_strict")
    assert not client.is_model_ready("torch_compile_bad_backend")
    with pytest.raises(InferenceServerException, match=r"torch\.compile has no backend 'no_such_backend'"):
        client.get_model_metadata("torch_compile_bad_backend")
    assert client.is_model_ready("torch_compiled")
