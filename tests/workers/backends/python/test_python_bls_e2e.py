"""Business Logic Scripting: a Python model calling other models through the
server (``pb_utils.InferenceRequest.exec/async_exec``), real process group."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.group import Server

LEVEL = "e2e"

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


# --- py_bls_check: request checks, response parameters, cancellation ---------------------


def check(server: Server, mode: str, timeout_s: float | None = None) -> Any:
    """py_bls_check's JSON report for ``mode`` (over gRPC, with a client deadline if given)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([0], dtype=np.int32))
    result = client.infer("py_bls_check", [inp], parameters={"mode": mode}, client_timeout=timeout_s)
    return json.loads(result.as_numpy("OUT")[0])


def executions(server: Server, model: str) -> tuple[int, int]:
    """The model's (inference count, failed requests) from the statistics extension."""
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(model)["model_stats"]
    return sum(s["inference_count"] for s in stats), sum(s["inference_stats"]["fail"]["count"] for s in stats)


INVALID = {
    "input_name": (3, "unexpected inference input 'WRONG' for model 'py_errors'"),
    "datatype": (3, "inference input 'INPUT0' data-type is 'FP32', but model 'py_errors' expects 'INT32'"),
    # Both inputs are [1,8]: Triton names the last one (its hash map walks them in reverse).
    "shape": (3, "unexpected shape for input 'INPUT1' for model 'simple'. Expected [-1,16], got [1,8]"),
    "model": (2, "Request for unknown model: 'no_such_model'"),
    "version": (2, "'py_errors' version 7 is not found"),
    "output": (3, "unexpected inference output 'NOPE' for model 'py_errors'"),
}


def test_a_wrong_bls_request_fails_only_that_call(server: Server) -> None:
    before = {model: executions(server, model) for model in ("py_errors", "simple")}
    report = check(server, "invalid")
    for calls in (report, report["async"]):
        for case, (code, message) in INVALID.items():
            assert calls[case]["code"] == code and message in calls[case]["error"], (case, calls[case])
    assert report["after"]["outputs"] == {"OUTPUT0": list(range(40, 72, 2))}  # the model went on
    assert report["bytes"]["outputs"] == {"OUTPUT0": ["AB", "C"]}
    # Refused before it was sent: the callees never saw the wrong requests (only the one good call).
    assert executions(server, "simple") == before["simple"]
    assert executions(server, "py_errors") == (before["py_errors"][0] + 1, before["py_errors"][1])


def test_model_management_from_a_model(server: Server) -> None:
    report = check(server, "control")
    assert (report["ready"], report["nope"], report["v7"]) == (True, False, False)
    assert "explicit model load / unload is not allowed" in report["load"]  # as the server's own API says


def test_bls_responses_carry_the_callees_parameters(server: Server) -> None:
    assert check(server, "params") == {
        "outputs": {"OUT": [20, 21, 22]},
        "parameters": {"note": "from py_params", "count": 3, "odd": False, "tag": "bls"},
    }


@pytest.mark.parametrize("mode,callee", [
    ("wait", "py_wait"), ("wait_async", "py_wait"), ("wait_stream", "py_wait_stream"),
])
def test_a_cancelled_request_cancels_its_bls_calls(server: Server, mode: str, callee: str) -> None:
    _, failed_before = executions(server, callee)
    with pytest.raises(InferenceServerException, match="Deadline"):
        check(server, mode, timeout_s=1.0)  # the client's deadline passes while the model waits in exec()
    last = check(server, "last")  # what the model saw; the instance is free again, so it did not hang
    assert last["mode"] == mode and last["is_cancelled"] is True
    assert last["got"][-1]["code"] == 7 and "cancelled" in last["got"][-1]["error"], last  # CANCELLED
    assert last["waited_s"] < 10  # not the callee's 20 s
    if mode == "wait_stream":
        assert last["got"][0] == {"outputs": {"OUT": [1]}, "parameters": {}}
    deadline = time.monotonic() + 10
    while executions(server, callee)[1] == failed_before:  # the callee was told, and stopped
        assert time.monotonic() < deadline, f"{callee} was not cancelled"
        time.sleep(0.05)
