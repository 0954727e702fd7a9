"""Sequence batching seen by real tritonclient callers of the real process group:
implicit state, control inputs, both strategies, Triton's errors, idle timeout,
a lost instance, and the routing hint. Models: tests/support/sequence_models.py.

HTTP and gRPC requests go through different ingress processes, so a sequence
interleaved over both shows that the router, not an ingress, keeps it on its
instance.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conveyor.deploy.runtime.procs import actor_role, children
from tests.support.group import Server, start_server, wait_all_instances_ready
from tests.support.metrics import scrape
from tests.support.sequence_models import accumulator
from tests.support.waiting import eventually

LEVEL = "e2e"

WAIT_S = 60.0  # generous: only reached when something is broken


def http_step(server: Server, model: str, sid: int | str, value: int, *, start: bool = False,
              end: bool = False, rows: int = 1) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=WAIT_S)
    try:
        inp = httpclient.InferInput("INPUT", [rows, 1], "INT32").set_data_from_numpy(
            np.full((rows, 1), value, np.int32))
        return client.infer(model, [inp], sequence_id=sid, sequence_start=start, sequence_end=end)
    finally:
        client.close()


def grpc_step(server: Server, model: str, sid: int | str, value: int, *, start: bool = False,
              end: bool = False) -> grpcclient.InferResult:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[value]], np.int32))
        return client.infer(model, [inp], sequence_id=sid, sequence_start=start, sequence_end=end,
                            client_timeout=WAIT_S)
    finally:
        client.close()


def total(result: Any) -> int:
    return int(result.as_numpy("OUTPUT").reshape(-1)[0])


def run_sequence(server: Server, model: str, sid: int | str, values: list[int]) -> list[int]:
    """One sequence, its requests alternating between the HTTP and the gRPC ingress."""
    sums = []
    for i, value in enumerate(values):
        step = http_step if (i + len(str(sid))) % 2 else grpc_step
        sums.append(total(step(server, model, sid, value, start=i == 0, end=i == len(values) - 1)))
    return sums


def running_sums(values: list[int]) -> list[int]:
    return [int(v) for v in np.cumsum(values)]


def check_concurrent_sequences(server: Server, model: str, ids: list[int | str]) -> None:
    plans = {sid: [k * 10 + j + 1 for j in range(6)] for k, sid in enumerate(ids)}
    with ThreadPoolExecutor(len(ids)) as pool:
        futures = {sid: pool.submit(run_sequence, server, model, sid, values) for sid, values in plans.items()}
        for sid, fut in futures.items():
            assert fut.result(WAIT_S) == running_sums(plans[sid]), f"sequence {sid!r}"


def test_direct_accumulator_keeps_each_sequences_state_across_http_and_grpc(server: Server) -> None:
    check_concurrent_sequences(server, "seq_direct", [101, 102, 103, 104, 105, 106])


def test_oldest_accumulator_starts_from_the_start_control(server: Server) -> None:
    check_concurrent_sequences(server, "seq_oldest", [201, 202, 203, 204, 205])


def test_python_model_keeps_state_by_correlation_id(server: Server) -> None:
    check_concurrent_sequences(server, "seq_python", [301, "py-302", 303, 304])


def test_string_and_integer_ids_are_different_sequences(server: Server) -> None:
    assert total(http_step(server, "seq_direct", "401", 5, start=True)) == 5
    assert total(grpc_step(server, "seq_direct", 401, 7, start=True)) == 7
    assert total(grpc_step(server, "seq_direct", "401", 1, end=True)) == 6
    assert total(http_step(server, "seq_direct", 401, 1, end=True)) == 8


def controls_of(result: Any) -> tuple[float, int, bool, Any]:
    return tuple(result.as_numpy(name).reshape(-1)[0] for name in ("OUT_START", "OUT_END", "OUT_READY",
                                                                    "OUT_CORRID"))


def test_control_inputs_follow_the_config_false_true_values(server: Server) -> None:
    sid = 2**64 - 1  # the whole UINT64 range is a sequence id
    first = http_step(server, "seq_controls", sid, 3, start=True)
    middle = http_step(server, "seq_controls", sid, 3)
    last = http_step(server, "seq_controls", sid, 3, end=True)
    assert controls_of(first) == (1.5, 10, True, sid)
    assert controls_of(middle) == (0.5, 10, True, sid)
    assert controls_of(last) == (0.5, 20, True, sid)
    both = grpc_step(server, "seq_controls", 17, 3, start=True, end=True)
    assert controls_of(both) == (1.5, 20, True, 17)


def test_string_correlation_id_reaches_a_string_corrid_input(server: Server) -> None:
    first = grpc_step(server, "seq_controls_string", "session-a", 1, start=True)
    assert controls_of(first) == (1.5, 10, True, b"session-a")
    last = http_step(server, "seq_controls_string", "session-a", 1, end=True)
    assert controls_of(last) == (0.5, 20, True, b"session-a")


@pytest.mark.parametrize("step", [http_step, grpc_step], ids=["http", "grpc"])
def test_integer_id_for_a_string_corrid_is_refused(server: Server, step: Any) -> None:
    # As Triton (InferenceRequest::ValidateCorrelationId, since 2.54; 2.51 passed on a malformed tensor).
    with pytest.raises(InferenceServerException) as exc:
        step(server, "seq_controls_string", 55, 1, start=True, end=True)
    assert exc.value.message() == (
        "[request id: <id_unknown>] sequence batching control 'CORRID' data-type is 'UINT64', but model "
        "'seq_controls_string' expects 'BYTES'")


def test_string_id_for_an_integer_corrid_is_refused(server: Server) -> None:
    with pytest.raises(InferenceServerException) as exc:
        http_step(server, "seq_controls", "abc", 1, start=True)
    assert (exc.value.status(), exc.value.message()) == (
        "400", "[request id: <id_unknown>] sequence batching control 'CORRID' data-type is 'BYTES', but model "
               "'seq_controls' expects 'UINT64'")


START_ERROR = (
    "inference request for sequence {sid} to model '{model}' must specify the START flag on the first request "
    "of the sequence"
)


def test_a_request_without_start_for_an_unknown_or_ended_sequence_is_refused(server: Server) -> None:
    with pytest.raises(InferenceServerException) as exc:
        http_step(server, "seq_direct", 501, 1)
    assert exc.value.status() == "400"
    assert exc.value.message() == START_ERROR.format(sid=501, model="seq_direct")
    assert total(grpc_step(server, "seq_direct", 502, 1, start=True, end=True)) == 1
    with pytest.raises(InferenceServerException) as exc:
        grpc_step(server, "seq_direct", 502, 1)
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert exc.value.message() == START_ERROR.format(sid=502, model="seq_direct")
    with pytest.raises(InferenceServerException) as exc:
        grpc_step(server, "seq_direct", "s-503", 1)
    assert exc.value.message() == START_ERROR.format(sid="s-503", model="seq_direct")


def test_a_request_without_a_sequence_id_or_with_several_rows_is_refused(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("INPUT", [1, 1], "INT32").set_data_from_numpy(np.ones((1, 1), np.int32))
    with pytest.raises(InferenceServerException) as exc:
        client.infer("seq_direct", [inp])
    assert exc.value.status() == "400"
    assert exc.value.message() == (
        "inference request to model 'seq_direct' must specify a non-zero or non-empty correlation ID"
    )
    with pytest.raises(InferenceServerException) as exc:
        http_step(server, "seq_direct", 601, 1, start=True, rows=2)
    assert exc.value.message() == (
        "inference request to model 'seq_direct' must specify batch-size 1 due to requirements of sequence batcher"
    )


def test_an_idle_sequence_frees_its_slot_for_the_backlog_and_needs_start_again(server: Server) -> None:
    # seq_idle has one slot and a 0.2 s idle timeout: B waits in the backlog until A idles out.
    assert total(http_step(server, "seq_idle", 701, 4, start=True)) == 4
    with ThreadPoolExecutor(1) as pool:
        waiting: Future[grpcclient.InferResult] = pool.submit(grpc_step, server, "seq_idle", 702, 1, start=True)
        assert total(waiting.result(WAIT_S)) == 1
    with pytest.raises(InferenceServerException) as exc:
        http_step(server, "seq_idle", 701, 1)
    assert exc.value.message() == START_ERROR.format(sid=701, model="seq_idle")
    assert total(http_step(server, "seq_idle", 702, 2, end=True)) == 3  # B's own state, not A's


BACKLOG_TIMEOUT_US = 300_000  # the waiting sequence's requests' timeout: far below seq_single's idle timeout


def test_a_sequence_waiting_for_a_slot_expires_at_its_requests_timeout(server: Server) -> None:
    # seq_single's one slot holds A, which never idles out here: B waits in the backlog until its timeout.
    assert total(http_step(server, "seq_single", 751, 4, start=True)) == 4
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inp = grpcclient.InferInput("INPUT", [1, 1], "INT32").set_data_from_numpy(np.ones((1, 1), np.int32))
        with pytest.raises(InferenceServerException) as exc:
            client.infer("seq_single", [inp], sequence_id=752, sequence_start=True, timeout=BACKLOG_TIMEOUT_US,
                         client_timeout=WAIT_S)
    finally:
        client.close()
    assert exc.value.status() == "StatusCode.UNAVAILABLE"
    assert exc.value.message() == "timeout of the corresponding sequence has been expired"
    with pytest.raises(InferenceServerException) as exc:
        http_step(server, "seq_single", 752, 1, end=True)  # the sequence is gone: it must START again
    assert exc.value.message() == START_ERROR.format(sid=752, model="seq_single")
    assert total(http_step(server, "seq_single", 751, 1, end=True)) == 5
    assert total(grpc_step(server, "seq_single", 752, 2, start=True, end=True)) == 2


def test_a_string_state_starts_empty_and_carries_each_requests_strings(server: Server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        got = []
        for i, words in enumerate([[b"a", b"bc"], [b"", b"def"], [b"g", b"h"]]):
            inp = grpcclient.InferInput("INPUT", [1, 2], "BYTES").set_data_from_numpy(np.array([words], np.object_))
            got.append(client.infer("seq_string_state", [inp], sequence_id=771, sequence_start=i == 0,
                                    sequence_end=i == 2).as_numpy("OUTPUT").tolist())
    finally:
        client.close()
    assert got == [[[b"", b""]], [[b"a", b"bc"]], [[b"", b"def"]]]


def backlogged(server: Server, metric: str, count: int) -> bool:
    return scrape(server).get(metric) == count


def answer_to(answer: Future[Any], result: Any, error: Any) -> None:
    answer.set_result(error)


def test_cancelling_a_request_of_a_waiting_sequence_cancels_the_whole_sequence(server: Server) -> None:
    # seq_single's one slot holds A: B's two requests wait in the backlog; cancelling the second cancels both.
    assert total(http_step(server, "seq_single", 761, 4, start=True)) == 4
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: list[Future[Any]] = [Future(), Future()]
    try:
        calls = []
        pending = 'nv_inference_pending_request_count{model="seq_single",version="1"}'
        for i, answer in enumerate(answers):  # one at a time: the second must not overtake the START
            inp = grpcclient.InferInput("INPUT", [1, 1], "INT32").set_data_from_numpy(np.ones((1, 1), np.int32))
            calls.append(client.async_infer("seq_single", [inp], partial(answer_to, answer), sequence_id=762,
                                            sequence_start=i == 0))
            eventually(partial(backlogged, server, pending, i + 1), WAIT_S, what="B's requests in the backlog")
        calls[1].cancel()
        errors = [answer.result(WAIT_S) for answer in answers]
    finally:
        client.close()
    assert [e.status() for e in errors] == ["StatusCode.CANCELLED"] * 2
    with pytest.raises(InferenceServerException) as exc:
        http_step(server, "seq_single", 762, 1, end=True)  # the sequence is gone: it must START again
    assert exc.value.message() == START_ERROR.format(sid=762, model="seq_single")
    assert total(http_step(server, "seq_single", 761, 1, end=True)) == 5


def test_sequence_answers_name_the_host_for_sticky_routing(server: Server) -> None:
    body = json.dumps({
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}],
        "parameters": {"sequence_id": 801, "sequence_start": True, "sequence_end": True},
    }).encode()
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/seq_direct/infer", body, method="POST")
    with urllib.request.urlopen(req, timeout=WAIT_S) as r:
        assert r.headers["conveyor-host"] == socket.gethostname()
        assert json.loads(r.read())["parameters"] == {"conveyor_host": socket.gethostname()}
    grpc = grpc_step(server, "seq_direct", 802, 1, start=True, end=True).get_response()
    assert grpc.parameters["conveyor_host"].string_param == socket.gethostname()
    plain = httpclient.InferenceServerClient(server.http_url).infer(
        "simple", [httpclient.InferInput(n, [1, 16], "INT32").set_data_from_numpy(np.ones((1, 16), np.int32))
                   for n in ("INPUT0", "INPUT1")])
    assert "parameters" not in plain.get_response()  # only sequence requests carry the hint


@pytest.fixture()
def two_worker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("lost"))
    accumulator(repo, "seq_lost", "direct { }", instances=0)  # one instance (4 slots) on each worker
    srv = start_server(repo, f"l{os.getpid()}", "--workers", "2")
    wait_all_instances_ready(srv.group, "seq_lost", 2)  # the sequences must spread over both
    yield srv
    assert srv.stop() == 0


def test_sequences_of_a_dead_worker_fail_until_started_again(two_worker_server: Server) -> None:
    srv = two_worker_server
    ids = [901, 902, 903, 904]  # spread over both instances (the one with most free slots first)
    for sid in ids:
        assert total(http_step(srv, "seq_lost", sid, 1, start=True)) == 1
    workers = [pid for pid, argv in children(srv.proc.pid).items() if actor_role(argv) == "worker"]
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    ok, lost = [], []
    for sid in ids:
        try:
            assert total(grpc_step(srv, "seq_lost", sid, 1)) == 2
            ok.append(sid)
        except InferenceServerException as exc:
            assert exc.status() == "StatusCode.UNAVAILABLE", exc.message()
            lost.append(sid)
    assert len(ok) == 2 and len(lost) == 2  # the other worker's sequences go on
    for sid in lost:
        with pytest.raises(InferenceServerException) as exc:  # type: ignore[misc]
            http_step(srv, "seq_lost", sid, 1)
        assert exc.value.status() == "503"  # type: ignore[misc]
        assert exc.value.message() == (  # type: ignore[misc]
            f"sequence {sid} of model 'seq_lost' was lost when the instance running it went away; "
            "start it again with the START flag"
        )
        assert total(http_step(srv, "seq_lost", sid, 5, start=True)) == 5  # started again, on a live instance
        assert total(grpc_step(srv, "seq_lost", sid, 1, end=True)) == 6
    for sid in ok:
        assert total(http_step(srv, "seq_lost", sid, 1, end=True)) == 3
