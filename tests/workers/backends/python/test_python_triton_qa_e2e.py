"""What Triton's python-backend QA (qa/L0_backend_python, run by deploy/triton_qa_python.sh)
checks, guarded here with our own models (tests/support/python_qa_models.py) on a group of
its own: instance names, ``model.py`` as a package, configs without inputs, the default
mode's response sender around ``execute``'s return, concurrent ``async def execute``, request
rescheduling and ``iterative_sequence``, BF16, ``triton_grpc_error``, ``file:/`` overrides,
BLS refused in ``initialize``, a worker lost while loading."""

from __future__ import annotations

import base64
import json
import os
import queue
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conveyor.router.repository.prepare import override_root
from tests.support import python_qa_models as qa
from tests.support.group import Server, start_server

LEVEL = "e2e"

WAIT_S = 30.0


@pytest.fixture(scope="module")
def qa_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    repo = str(tmp_path_factory.mktemp("qa_models"))
    names = str(tmp_path_factory.mktemp("qa_names"))
    qa.build(repo, names)
    overrides = set(os.listdir(override_root()))  # other runs' on this host
    srv = start_server(repo, f"qa{os.getpid()}", "--workers", "1", "--model-control-mode", "explicit",
                       "--load-model", "*")
    yield srv, names
    assert srv.stop() == 0
    # What a load with file overrides wrote goes with the server, as Triton's does.
    assert not [d for d in set(os.listdir(override_root())) - overrides if d.startswith("qa_")]


def mode_input(mode: int, grpc: bool = True) -> Any:
    inp = (grpcclient if grpc else httpclient).InferInput("MODE", [1], "INT32")
    inp.set_data_from_numpy(np.array([mode], np.int32))
    return inp


def test_instances_have_tritons_names(qa_server: tuple[Server, str]) -> None:
    """<group>_<index in the group>: an unnamed group is <model>_<group index>."""
    _, names = qa_server
    assert sorted(os.listdir(names)) == ["qa_names_0_0", "qa_names_0_1", "special_0"]


def test_model_py_is_a_package_and_needs_no_inputs(qa_server: tuple[Server, str]) -> None:
    server, _ = qa_server
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("qa_package", [])
    assert result.as_numpy("OUT").tolist() == [42]  # relative_helper (from . import) + plain_helper


@pytest.mark.parametrize("grpc", [True, False], ids=["grpc", "http"])
@pytest.mark.parametrize(("mode", "value"), [(0, 2000), (1, 1000), (2, 1000), (4, 0)],
                         ids=["sent-after-return", "second-send-raises", "returned-after-final", "returned"])
def test_the_default_modes_response_sender(qa_server: tuple[Server, str], grpc: bool, mode: int, value: int) -> None:
    server, _ = qa_server
    client: Any = (grpcclient.InferenceServerClient(server.grpc_url) if grpc
                   else httpclient.InferenceServerClient(server.http_url))
    assert client.infer("qa_sender", [mode_input(mode, grpc)]).as_numpy("OUT").tolist() == [value]


def test_a_final_flag_before_any_response_is_tritons_error(qa_server: tuple[Server, str]) -> None:
    server, _ = qa_server
    with pytest.raises(InferenceServerException) as info:
        grpcclient.InferenceServerClient(server.grpc_url).infer("qa_sender", [mode_input(3)])
    assert "Non-decoupled model cannot send complete final before sending a response" in str(info.value.message())
    assert "qa_sender_0_0" in str(info.value.message())  # the instance, by Triton's name


def test_a_task_of_async_execute_answers_after_it_returned(qa_server: tuple[Server, str]) -> None:
    server, _ = qa_server
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("qa_async_sender", [mode_input(0)])
    assert result.as_numpy("OUT").tolist() == [2000]


class Stream:
    def __init__(self, server: Server, **headers: str) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.replies.put((result, error)),
                                 headers=headers or None)

    def take(self, count: int) -> list[tuple[Any, Any]]:
        return [self.replies.get(timeout=WAIT_S) for _ in range(count)]

    def close(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()


def wait_input(seconds: float) -> Any:
    inp = grpcclient.InferInput("WAIT", [1], "FP32")
    inp.set_data_from_numpy(np.array([seconds], np.float32))
    return inp


@pytest.mark.parametrize("model", ["qa_sleeper", "qa_async_bls"], ids=["sleeps", "awaits-a-decoupled-bls-call"])
def test_decoupled_async_executes_run_concurrently_on_one_instance(qa_server: tuple[Server, str], model: str) -> None:
    server, _ = qa_server
    stream = Stream(server)
    try:
        start = time.monotonic()
        for _ in range(4):
            stream.client.async_stream_infer(model, [wait_input(2.0)])
        replies = stream.take(4)
        took = time.monotonic() - start
    finally:
        stream.close()
    assert [e for _, e in replies] == [None] * 4
    assert took < 6.0, f"4 requests of 2 s on one instance took {took:.1f} s: not concurrent"


def test_a_shorter_async_execute_answers_first(qa_server: tuple[Server, str]) -> None:
    server, _ = qa_server
    stream = Stream(server)
    try:
        stream.client.async_stream_infer("qa_sleeper", [wait_input(3.0)])
        stream.client.async_stream_infer("qa_sleeper", [wait_input(0.5)])
        replies = stream.take(2)
    finally:
        stream.close()
    assert [r.as_numpy("OUT").tolist() for r, _ in replies] == [[0.5], [3.0]]


def int_input(value: int) -> Any:
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([value], np.int32))
    return inp


def test_a_rescheduled_request_is_executed_again(qa_server: tuple[Server, str]) -> None:
    server, _ = qa_server
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("qa_reschedule", [int_input(21)], request_id="r1")
    assert result.as_numpy("OUT").tolist() == [42]


def test_a_rescheduled_request_must_not_be_answered(qa_server: tuple[Server, str]) -> None:
    server, _ = qa_server
    with pytest.raises(InferenceServerException) as info:
        grpcclient.InferenceServerClient(server.grpc_url).infer("qa_reschedule_wrong", [int_input(1)])
    assert "Expected a None object in the execute function return list for reschduled request" in str(
        info.value.message()
    )


def test_an_iterative_sequence_answers_once_per_execute(qa_server: tuple[Server, str]) -> None:
    server, _ = qa_server
    stream = Stream(server)
    try:
        stream.client.async_stream_infer("qa_iterative", [int_input(3)], request_id="it")
        replies = stream.take(3)
    finally:
        stream.close()
    assert [e for _, e in replies] == [None] * 3
    assert [r.as_numpy("OUT").tolist() for r, _ in replies] == [[2], [1], [0]]


def test_bf16_goes_through_dlpack_and_not_numpy(qa_server: tuple[Server, str]) -> None:
    pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")  # tritonclient's own dependency, for BF16
    server, _ = qa_server
    inp = httpclient.InferInput("IN", [2], "BF16")
    inp.set_data_from_numpy(np.array([1.5, -2.0], ml_dtypes.bfloat16))
    result = httpclient.InferenceServerClient(server.http_url).infer("qa_bf16", [inp])
    assert result.get_response()["outputs"][0]["datatype"] == "BF16"
    assert result.as_numpy("OUT").astype(np.float32).tolist() == [3.0, -4.0]


def test_triton_grpc_error_ends_the_stream_with_the_errors_status(qa_server: tuple[Server, str]) -> None:
    server, _ = qa_server
    plain = Stream(server)
    try:
        plain.client.async_stream_infer("qa_sender", [mode_input(3)])
        plain.client.async_stream_infer("qa_sender", [mode_input(4)])
        (_, in_band), (after, error) = plain.take(2)
    finally:
        plain.close()
    assert isinstance(in_band, InferenceServerException) and in_band.status() is None  # in-band: the stream goes on
    assert error is None and after.as_numpy("OUT").tolist() == [0]

    ending = Stream(server, triton_grpc_error="true")
    try:
        ending.client.async_stream_infer("qa_sender", [mode_input(3)])
        (_, status), = ending.take(1)
    finally:
        ending.close()
    assert isinstance(status, InferenceServerException) and status.status() == "StatusCode.INTERNAL"
    assert "cannot send complete final before sending a response" in str(status.message())


@pytest.mark.parametrize(("ignore", "total", "cancelled"), [(True, 20, False), (False, None, True)],
                         ids=["callee-ignores-it", "callee-honours-it"])
def test_a_decoupled_bls_iterators_cancel_asks_the_callee(qa_server: tuple[Server, str], ignore: bool,
                                                           total: int | None, cancelled: bool) -> None:
    """As Triton: cancel() asks the callee to stop and the iteration goes on with what it sends."""
    server, _ = qa_server
    inp = grpcclient.InferInput("IGNORE", [1], "BOOL")
    inp.set_data_from_numpy(np.array([ignore], bool))
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("qa_bls_cancel", [inp])
    assert result.as_numpy("CANCELLED").tolist() == [cancelled]
    got = int(result.as_numpy("SUM")[0])
    assert got == total if total is not None else 5 <= got < 20


def test_a_model_decides_its_readiness(qa_server: tuple[Server, str]) -> None:
    """A model.py with is_ready() (here a coroutine) answers /v2/models/<m>/ready, HTTP and gRPC."""
    server, _ = qa_server
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert http.is_model_ready("qa_says_ready") and grpc.is_model_ready("qa_says_ready")
    assert not http.is_model_ready("qa_says_not_ready") and not grpc.is_model_ready("qa_says_not_ready")
    assert http.is_model_ready("qa_package")  # no is_ready(): its state, as before


def load(server: Server, name: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/models/{name}/load",
                                     data=json.dumps(body or {}).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_file_override_may_start_with_a_slash(qa_server: tuple[Server, str]) -> None:
    """Triton's model_control QA loads "file:/1/model.py" (left loaded: its folder goes when the server stops)."""
    server, _ = qa_server
    config = {"name": "qa_override", "backend": "python",
              "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}]}
    code = base64.b64encode(qa.PACKAGE_MODEL.replace("from . import relative_helper\n", "")
                            .replace("relative_helper.VALUE + plain_helper.VALUE", "7")
                            .replace("import plain_helper\n", "").encode()).decode()
    status, text = load(server, "qa_override", {"parameters": {"config": json.dumps(config), "file:/1/model.py": code}})
    assert status == 200, text
    assert grpcclient.InferenceServerClient(server.grpc_url).infer("qa_override", []).as_numpy("OUT").tolist() == [7]


def test_bls_in_initialize_is_refused(qa_server: tuple[Server, str]) -> None:
    server, _ = qa_server
    qa.write_failing(server.repo, "qa_bls_init", qa.BLS_IN_INITIALIZE_MODEL)
    status, text = load(server, "qa_bls_init")
    assert status == 400 and "BLS is only supported during the 'execute' function." in text


def test_a_worker_lost_while_loading_fails_the_load(qa_server: tuple[Server, str]) -> None:
    """Last: it costs the group its worker (the supervisor starts another)."""
    server, _ = qa_server
    qa.write_failing(server.repo, "qa_kills_worker", qa.KILLS_ITS_WORKER_MODEL)
    status, text = load(server, "qa_kills_worker")
    assert status == 400 and "qa_kills_worker_0" in text and "exited" in text, text
