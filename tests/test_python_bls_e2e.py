"""Business Logic Scripting: a Python model calling other models through the
server (``pb_utils.InferenceRequest.exec/async_exec``), real process group."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import Server

A = np.arange(20, 36, dtype=np.int32)  # no 13: py_errors raises on it
B = np.full(16, 3, dtype=np.int32)


def bls(server: Server, mode: str) -> Any:
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = []
    for name, array in (("INPUT0", A), ("INPUT1", B)):
        inp = httpclient.InferInput(name, [16], "INT32")
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    result = client.infer("py_bls", inputs, parameters={"mode": mode})
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def test_bls_calls_an_onnx_model(server: Server) -> None:
    out0, out1 = bls(server, "onnx")
    np.testing.assert_array_equal(out0, A + B)
    np.testing.assert_array_equal(out1, A - B)


def test_bls_calls_a_python_model_and_gets_every_output_by_default(server: Server) -> None:
    out0, out1 = bls(server, "python")
    np.testing.assert_array_equal(out0, A * 2)
    np.testing.assert_array_equal(out1, B)


def test_async_exec_runs_two_calls_with_gather(server: Server) -> None:
    out0, out1 = bls(server, "gather")
    np.testing.assert_array_equal(out0, A - B)
    np.testing.assert_array_equal(out1, B * 2)


def test_bls_into_a_decoupled_model(server: Server) -> None:
    out0, _ = bls(server, "decoupled")
    np.testing.assert_array_equal(out0[:4], [20, 21, 22, 0])


@pytest.mark.parametrize("mode,message", [
    ("error", "callee: negative input is not allowed"),
    ("missing", "callee: .*no_such_model"),
    ("self", "callee: request timeout expired before the model ran it"),  # its only instance is busy: itself
])
def test_callee_errors_come_back_in_the_response(server: Server, mode: str, message: str) -> None:
    with pytest.raises(InferenceServerException, match=message):
        bls(server, mode)
    np.testing.assert_array_equal(bls(server, "python")[0], A * 2)  # and the model keeps serving
