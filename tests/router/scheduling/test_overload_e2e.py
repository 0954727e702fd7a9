"""Overload refused in time, on the real process group: a Python model that sleeps 0.5 s per
request on one instance, with ``MAX_WAITING_REQUESTS: 16``.

200 HTTP clients at once: each is served or refused at once with 503 and ``Retry-After``, none
waits past its deadline, and /metrics counts every refusal. A deadline that passes while a
request is queued ends it and frees its place; gRPC is refused UNAVAILABLE; a reload through the
repository's load with a ``config`` changes the limit without failing a request in flight.
One group for the whole module (the suite runs on 2 cores)."""

from __future__ import annotations

import http.client
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.group import Server, router_control, start_server
from tests.support.metrics import metrics_text
from tests.support.python_models import write_model
from tests.support.waiting import eventually

LEVEL = "e2e"

pytestmark = pytest.mark.timeout(240)

SLEEP_S = 0.5  # each execution
LIMIT = 16
CLIENTS = 200
# A refusal is "at once": the typical one under half an execution (the client never waited for the
# model), the slowest under two, far from the 8 s a queued request waits here (200 client threads share
# the GIL and 2 busy cores with the group: most of that time is theirs, and one of them may be left
# waiting for a turn).
AT_ONCE_S = SLEEP_S / 2
SLOWEST_REFUSAL_S = 2 * SLEEP_S
# The burst's deadline: enough for the LIMIT admitted requests to run one after the other
# (LIMIT * SLEEP_S = 8 s) on a busy 2-core machine.
BURST_DEADLINE_MS = 14_000
# Slack on top of a deadline for the answer to reach the client (the ingress cuts at +50 ms).
ANSWER_SLACK_S = 0.5

SLEEPY_MODEL = f'''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep({SLEEP_S})
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.copy())]))
        return responses
'''


def sleepy_config(limit: int) -> dict[str, Any]:
    return {
        "name": "sleepy", "backend": "python", "max_batch_size": 0,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [1]}],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {"MAX_WAITING_REQUESTS": {"string_value": str(limit)}},
    }


SLEEPY_CONFIG = f'''
name: "sleepy"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "MAX_WAITING_REQUESTS" value {{ string_value: "{LIMIT}" }} }}
'''

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [7]}]}).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("overload")
    write_model(str(repo), "sleepy", SLEEPY_MODEL, SLEEPY_CONFIG)
    srv = start_server(str(repo), f"ov{os.getpid()}", "--workers", "1", "--model-control-mode", "explicit",
                       "--load-model", "sleepy")
    yield srv
    assert srv.stop() == 0


@dataclass
class Outcome:
    status: int
    took_s: float
    retry_after: str | None
    body: str


def post(server: Server, deadline_ms: int | None = None, start: threading.Barrier | None = None,
         route: str = "infer", body: bytes = BODY) -> Outcome:
    """One KServe infer over its own connection (loopback), timed from just before it is sent."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        headers = {"Content-Type": "application/json"}
        if deadline_ms is not None:
            headers["conveyor-timeout-ms"] = str(deadline_ms)
        conn.connect()
        if start is not None:
            start.wait()
        began = time.monotonic()
        conn.request("POST", f"/v2/models/sleepy/{route}", body, headers)
        resp = conn.getresponse()
        answer = resp.read().decode()
        return Outcome(resp.status, time.monotonic() - began, resp.getheader("Retry-After"), answer)
    finally:
        conn.close()


def refusals(server: Server) -> int:
    found = re.search(r'^conveyor_overload_refusals_total\{model="sleepy",reason="max_waiting_requests",'
                      r'version="1"\} (\d+)$', metrics_text(server), re.M)
    assert found, "no refusal counter for sleepy"
    return int(found.group(1))


def rejected(server: Server) -> int:
    """Triton's count of the model's REJECTED failures."""
    found = re.search(r'^nv_inference_request_failure\{model="sleepy",reason="REJECTED",version="1"\} (\d+)$',
                      metrics_text(server), re.M)
    assert found, "no REJECTED failures for sleepy"
    return int(found.group(1))


def waiting(server: Server) -> int:
    found = re.search(r'^conveyor_waiting_requests\{model="sleepy",version="1"\} (\d+)$', metrics_text(server), re.M)
    assert found, "no waiting gauge for sleepy"
    return int(found.group(1))


def idle(server: Server) -> None:
    eventually(lambda: waiting(server) == 0, 30, what="sleepy still has requests waiting")


def test_200_clients_are_each_served_or_refused_at_once(server: Server) -> None:
    idle(server)
    before, failed_before = refusals(server), rejected(server)
    start = threading.Barrier(CLIENTS)
    with ThreadPoolExecutor(CLIENTS) as pool:
        futures = [pool.submit(post, server, BURST_DEADLINE_MS, start) for _ in range(CLIENTS)]
        outcomes = [f.result(60) for f in futures]
    served = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 503]
    assert len(served) + len(refused) == CLIENTS, {o.status: o.body for o in outcomes}
    assert len(served) >= LIMIT and refused, (len(served), len(refused))
    assert all(o.retry_after == "1" for o in refused)
    assert all("Exceeds maximum waiting requests" in o.body and "MAX_WAITING_REQUESTS 16" in o.body
               for o in refused), refused[0].body
    times = sorted(o.took_s for o in refused)
    assert times[-1] < SLOWEST_REFUSAL_S and times[len(times) // 2] < AT_ONCE_S, \
        f"refusals took {times[0]:.3f}-{times[-1]:.3f} s"
    assert max(o.took_s for o in served) < BURST_DEADLINE_MS / 1000
    assert refusals(server) - before == len(refused)
    assert rejected(server) - failed_before == len(refused)  # as Triton counts a full queue
    idle(server)


def test_a_deadline_that_passes_in_the_queue_ends_the_request_and_frees_its_place(server: Server) -> None:
    idle(server)
    deadline_ms = 1200
    with ThreadPoolExecutor(LIMIT) as pool:
        start = threading.Barrier(LIMIT)
        futures = [pool.submit(post, server, deadline_ms, start) for _ in range(LIMIT)]
        outcomes = [f.result(30) for f in futures]
    served = [o for o in outcomes if o.status == 200]
    expired = [o for o in outcomes if o.status != 200]
    # One or two ran in the 1.2 s; the others never did, and none waited past its deadline.
    assert 1 <= len(served) <= 3 and len(expired) == LIMIT - len(served), [o.status for o in outcomes]
    # Ended in the router's queue, or (the one running at its deadline) cut by the ingress.
    assert all(o.status == 400 and ("request timeout expired before the model ran it" in o.body
                                    or "Deadline Exceeded" in o.body) for o in expired), expired
    assert sum("before the model ran it" in o.body for o in expired) >= LIMIT - 4
    assert all(o.took_s < deadline_ms / 1000 + ANSWER_SLACK_S for o in outcomes)
    # Their places are free at once: at most the one the model still runs waits.
    assert waiting(server) <= 1
    idle(server)
    assert post(server).status == 200


def test_a_request_running_past_its_deadline_is_answered_at_its_deadline(server: Server) -> None:
    idle(server)
    outcome = post(server, deadline_ms=100)  # the model takes 0.5 s
    assert outcome.status == 400 and "Deadline Exceeded" in outcome.body
    assert outcome.took_s < SLEEP_S
    idle(server)


def test_generate_takes_the_deadline_header_too(server: Server) -> None:
    idle(server)
    outcome = post(server, deadline_ms=100, route="generate", body=b'{"INPUT0": [7]}')
    assert outcome.status == 400 and "Deadline Exceeded" in outcome.body and outcome.took_s < SLEEP_S
    assert json.loads(post(server, route="generate", body=b'{"INPUT0": [7]}').body)["OUTPUT0"] == 7
    idle(server)


def test_a_bad_deadline_header_is_refused(server: Server) -> None:
    outcome = post(server, deadline_ms=0)
    assert outcome.status == 400 and "conveyor-timeout-ms" in outcome.body


def _fill(server: Server, pool: ThreadPoolExecutor, count: int, deadline_ms: int) -> list[Future[Outcome]]:
    """``count`` requests in flight (short deadlines, so that they drain soon), once they wait."""
    futures = [pool.submit(post, server, deadline_ms) for _ in range(count)]
    eventually(lambda: waiting(server) >= count, 10, what=f"{count} requests never waited", interval=0.02)
    return futures


def test_grpc_is_refused_unavailable(server: Server) -> None:
    idle(server)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [1], "INT32")
    inp.set_data_from_numpy(np.array([7], np.int32))
    try:
        with ThreadPoolExecutor(LIMIT) as pool:
            futures = _fill(server, pool, LIMIT, 1500)
            with pytest.raises(InferenceServerException) as refused:
                client.infer("sleepy", [inp], client_timeout=5)
            for f in futures:
                f.result(30)
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert "Exceeds maximum waiting requests" in (refused.value.message() or "")
        idle(server)
        assert client.infer("sleepy", [inp], client_timeout=5).as_numpy("OUTPUT0").tolist() == [7]
    finally:
        client.close()


def _instances(server: Server) -> list[int]:
    return [i["index"] for i in router_control(server.group, "instances") if i["model"] == "sleepy"]


def test_new_limits_through_load_with_config_apply_and_fail_nothing_in_flight(server: Server) -> None:
    """A config that changes only the limits applies in place (the same instance serves on); one
    that changes more is a reload (a new instance, the old one finishing its queue). Either way
    the new limit counts the requests already waiting, and none of them fails."""
    idle(server)
    http = httpclient.InferenceServerClient(server.http_url)
    serving = _instances(server)
    try:
        with ThreadPoolExecutor(14) as pool:
            # No deadline: these all run, 7 s of work, most of it still waiting after both loads.
            in_flight = [pool.submit(post, server) for _ in range(14)]
            eventually(lambda: waiting(server) >= 14, 10, what="14 requests never waited", interval=0.02)
            generation = router_control(server.group, "lora_adapters")["generation"]
            http.load_model("sleepy", config=json.dumps(sleepy_config(4)))
            in_place = post(server)
            assert _instances(server) == serving  # nothing reloaded
            # ... but the repository changed: the ingresses read the config again (MAX_MIGRATIONS is theirs).
            assert router_control(server.group, "lora_adapters")["generation"] > generation
            reload = sleepy_config(6)
            reload["parameters"]["note"] = {"string_value": "reloaded"}
            http.load_model("sleepy", config=json.dumps(reload))  # answered once the new instance serves
            reloaded = post(server)
            assert _instances(server) != serving
            finished = [f.result(30) for f in in_flight]
        assert [o.status for o in finished] == [200] * 14
        # The requests already waiting counted against each new limit.
        assert in_place.status == 503 and "MAX_WAITING_REQUESTS 4" in in_place.body, in_place.body
        assert reloaded.status == 503 and "MAX_WAITING_REQUESTS 6" in reloaded.body, reloaded.body
        idle(server)
        start = threading.Barrier(8)
        with ThreadPoolExecutor(8) as pool:
            burst = [f.result(30) for f in [pool.submit(post, server, None, start) for _ in range(8)]]
        statuses = sorted(o.status for o in burst)
        assert 503 in statuses and statuses.count(200) >= 6, statuses
    finally:
        http.load_model("sleepy", config=json.dumps(sleepy_config(LIMIT)))
        http.close()
