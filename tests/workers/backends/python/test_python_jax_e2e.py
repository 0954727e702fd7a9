"""docs/backends/jax.md's JAX example (a Python-backend model.py running jax.jit on the CPU), served as
the docs print it, called over HTTP and gRPC, single and dynamically batched, against JAX here."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conveyor.deploy.example_repo import write_model
from tests.support.group import Server, start_server

LEVEL = "e2e"

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install jax): the docs' JAX example is not served")

DOCS = Path(__file__).resolve().parents[4] / "docs" / "backends" / "jax.md"


def example(name: str) -> str:
    """The code block docs/backends/jax.md marks with ``<!-- jax-example: NAME -->``."""
    found = re.search(rf"<!-- jax-example: {re.escape(name)} -->\n```[a-z]*\n(.*?)```", DOCS.read_text(), re.S)
    assert found, f"docs/backends/jax.md has no jax-example block for {name}"
    return found.group(1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("jax")
    write_model(repo, "jax_tanh", example("config.pbtxt"), {"model.py": example("1/model.py")})
    srv = start_server(str(repo), f"jax{os.getpid()}", "--workers", "1")
    yield srv
    assert srv.stop() == 0


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> Any:
    return httpclient if request.param == "http" else grpcclient


def expected(x: np.ndarray) -> np.ndarray:
    w = jax.random.normal(jax.random.PRNGKey(0), (4, 2), dtype=jax.numpy.float32)
    return np.tanh(x @ np.asarray(w))


def infer(server: Server, protocol: Any, x: np.ndarray) -> np.ndarray:
    client = protocol.InferenceServerClient(server.http_url if protocol is httpclient else server.grpc_url)
    inp = protocol.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result: np.ndarray = client.infer("jax_tanh", [inp]).as_numpy("Y")
    return result


def test_the_docs_jax_model_answers_as_jax_does(server: Server, protocol: Any) -> None:
    for rows in (1, 3):
        x = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
        np.testing.assert_allclose(infer(server, protocol, x), expected(x), rtol=1e-5, atol=1e-6)

    def one(i: int) -> None:
        x = np.random.default_rng(10 + i).standard_normal((1 + i % 2, 4)).astype(np.float32)
        np.testing.assert_allclose(infer(server, protocol, x), expected(x), rtol=1e-5, atol=1e-6)

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(one, range(12)))
