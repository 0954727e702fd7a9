"""``nv_inference_pending_request_count`` of a model without dynamic batching, as Triton counts it (qa/L0_metrics
metrics_queue_size_test's test_default_scheduler): every request that is not executing is pending, those the router
has already sent on to the instance's worker behind the running one (its pipeline) included."""

from __future__ import annotations

import os
import queue
import re

import numpy as np
import tritonclient.grpc as grpcclient

from tests.support.group import start_server
from tests.support.metrics import metrics_text
from tests.support.triton_test_models import identity
from tests.support.waiting import eventually

LEVEL = "e2e"

MODEL = "slow"
# Fewer than the router's DEEP_IN_FLIGHT: the instance holds 2 of them (PIPELINE_DEPTH), 1 of which runs, and one
# more waits at the router.
REQUESTS = 3
DELAY_MS = 2500  # each request's execution: long enough to read the metric while the first one runs
WAIT_S = 60.0  # generous: only reached when something is broken


def test_requests_waiting_behind_the_running_one_are_pending(tmp_path: object) -> None:
    repo = os.path.join(str(tmp_path), "repo")
    identity(repo, MODEL, "TYPE_FP32", 4, f'parameters [ {{ key: "execute_delay_ms" value: {{ string_value: '
             f'"{DELAY_MS}" }} }} ]', dims="[ 1 ]")  # the default scheduler: no dynamic_batching
    server = start_server(repo, f"pc{os.getpid()}", "--workers", "1")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[object] = queue.Queue()

    def pending() -> int:
        found = re.search(rf'^nv_inference_pending_request_count{{model="{MODEL}",version="1"}} (\d+)$',
                          metrics_text(server), re.M)
        return int(found[1]) if found else -1

    try:
        assert pending() == 0
        for _ in range(REQUESTS):
            row = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
            row.set_data_from_numpy(np.ones((1, 1), np.float32))
            client.async_infer(MODEL, [row], lambda result, error: answers.put(error or result))
        # One executes, every other one waits (Triton's 9 of 10); before, the one sent on behind it was not counted.
        eventually(lambda: pending() == REQUESTS - 1, WAIT_S, what="every request but the running one pending",
                   interval=0.1)
        for _ in range(REQUESTS):
            assert isinstance(answers.get(timeout=WAIT_S), grpcclient.InferResult)
        assert pending() == 0
    finally:
        client.close()
        assert server.stop() == 0
