"""ModelInfer calls that end before their answer, on the group's own gRPC ingress (ngh2):
the client resets the stream, drops the connection, or its deadline passes. A plain call
(its model's signature known, not decoupled) runs without a task (``service.start_infer``);
the first call to a model runs in a task: each way must take the request off the router's
queue, count it once, and give its in-flight place back.

The model runs a batch only once it holds 4 rows (tests/support/models.py), so a request
stays queued until the test sends the rest, without relying on timing.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conveyor.proto import grpc_service_pb2 as pb
from tests.support.group import Server, start_server
from tests.support.h2_attacks import Attacker, data_frame, headers_frame, message, request_headers
from tests.support.metrics import metrics_text
from tests.support.models import position

LEVEL = "e2e"

WAIT_S = 60.0  # generous: only reached when something is broken
MODEL = "gated"
# Fewer than the calls each test ends: a place not given back refuses the last request.
MAX_INFLIGHT = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("gated"))
    position(repo, MODEL, "preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000")
    srv = start_server(repo, f"ge{os.getpid()}", "--workers", "1", "--grpc-ingress", "1",
                       "--max-inflight-requests", str(MAX_INFLIGHT))
    yield srv
    assert srv.stop() == 0


def _gauge(server: Server, name: str, labels: str) -> int:
    found = re.search(rf"^{name}{{{labels}}} (\d+)$", metrics_text(server), re.M)
    assert found, f"no {name}{{{labels}}}"
    return int(found.group(1))


def pending(server: Server) -> int:
    return _gauge(server, "nv_inference_pending_request_count", f'model="{MODEL}",version="1"')


def cancelled(server: Server) -> int:
    return _gauge(server, "nv_inference_request_failure", f'model="{MODEL}",reason="CANCELED",version="1"')


def wait_pending(server: Server, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while pending(server) != count:
        assert time.monotonic() < deadline, f"{MODEL} never had {count} queued requests"
        time.sleep(0.05)


def rows(n: int) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("INPUT0", [n, 1], "INT32")
    inp.set_data_from_numpy(np.ones((n, 1), np.int32))
    return [inp]


def full_batch_runs_alone(client: grpcclient.InferenceServerClient) -> None:
    """A 4-row request leaves at once, alone: what was cancelled is not in its batch, and the
    ingress has a place for it (``MAX_INFLIGHT``)."""
    result = client.infer(MODEL, rows(4), client_timeout=WAIT_S)
    assert result.as_numpy("OUTPUT0").reshape(-1).tolist() == [1, 2, 3, 4]


def test_a_reset_stream_takes_its_request_off_the_queue(server: Server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        before = cancelled(server)
        answers: list[InferenceServerException | None] = []
        for _ in range(MAX_INFLIGHT + 1):  # the first may run in a task (signature unknown), the rest do not
            ctx = client.async_infer(MODEL, rows(1), lambda result, error: answers.append(error))
            wait_pending(server, 1)
            ctx.cancel()  # RST_STREAM CANCEL
            wait_pending(server, 0)
        assert cancelled(server) == before + MAX_INFLIGHT + 1
        full_batch_runs_alone(client)
        assert len(answers) == MAX_INFLIGHT + 1
        assert all(e is not None and e.status() == "StatusCode.CANCELLED" for e in answers), answers
    finally:
        client.close()


def test_a_lost_connection_takes_its_request_off_the_queue(server: Server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        full_batch_runs_alone(client)  # the signature is known: the calls below take the task-free way
        before = cancelled(server)
        request = pb.ModelInferRequest(model_name=MODEL)
        request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 1])
        request.raw_input_contents.append(np.ones(1, np.int32).tobytes())
        body = message(request.SerializeToString())
        port = int(server.grpc_url.rsplit(":", 1)[1])
        for _ in range(MAX_INFLIGHT + 1):
            peer = Attacker(port, "lost")
            head = headers_frame(1, peer.block(request_headers("ModelInfer")))
            peer.send(head + data_frame(1, body, end_stream=True))
            wait_pending(server, 1)
            peer.close()  # no RST_STREAM, no GOAWAY: the connection is gone
            wait_pending(server, 0)
        assert cancelled(server) == before + MAX_INFLIGHT + 1
        full_batch_runs_alone(client)
    finally:
        client.close()


def test_a_passed_deadline_answers_deadline_exceeded_and_the_request_never_runs(server: Server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        full_batch_runs_alone(client)
        for _ in range(MAX_INFLIGHT + 1):
            with pytest.raises(InferenceServerException) as late:
                client.infer(MODEL, rows(1), client_timeout=0.3)
            # From the ingress's timer ("Deadline Exceeded") or the router's, whichever is first.
            assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"
            wait_pending(server, 0)
        full_batch_runs_alone(client)
    finally:
        client.close()
