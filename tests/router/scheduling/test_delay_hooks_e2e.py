"""Triton's scheduler test hooks (router/scheduling/delay_hooks.py) on a real group, as Triton's QA sets them:
with ``TRITONSERVER_DELAY_SCHEDULER=3`` in the server's environment, a model's first requests wait, however
free its instance is, until three are queued; they then run as one batch, and the scheduler is as always from
then on. The ``position`` model answers each row with its place in the batch it ran in."""

from __future__ import annotations

import os
import queue
import re

import numpy as np
import tritonclient.grpc as grpcclient

from conveyor.router.scheduling.delay_hooks import DELAY_ENV
from tests.support.group import start_server
from tests.support.metrics import metrics_text
from tests.support.models import position
from tests.support.waiting import eventually

LEVEL = "e2e"

MODEL = "pos"
HELD = 3
WAIT_S = 60.0  # generous: only reached when something is broken


def test_the_first_batch_waits_for_the_delay_schedulers_count_then_all_is_as_always(tmp_path: object) -> None:
    repo = os.path.join(str(tmp_path), "repo")
    position(repo, MODEL, "")  # dynamic batching with no queue delay: a free instance takes what is queued
    server = start_server(repo, f"dh{os.getpid()}", "--workers", "1", env={**os.environ, DELAY_ENV: str(HELD)})
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[object] = queue.Queue()

    def send() -> None:
        row = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
        row.set_data_from_numpy(np.ones((1, 1), np.int32))
        client.async_infer(MODEL, [row], lambda result, error: answers.put(error or result.as_numpy("OUTPUT0")))

    def pending() -> int:
        found = re.search(rf'^nv_inference_pending_request_count{{model="{MODEL}",version="1"}} (\d+)$',
                          metrics_text(server), re.M)
        return int(found[1]) if found else -1

    try:
        for _ in range(HELD - 1):
            send()
        eventually(lambda: pending() == HELD - 1, WAIT_S, what="the first requests held in the queue")
        assert answers.empty()
        send()
        places = sorted(int(np.asarray(answers.get(timeout=WAIT_S)).reshape(-1)[0]) for _ in range(HELD))
        assert places == list(range(1, HELD + 1))  # one batch of all three
        send()  # held no more: it runs at once, alone
        assert np.asarray(answers.get(timeout=WAIT_S)).reshape(-1).tolist() == [1]
    finally:
        client.close()
        assert server.stop() == 0
