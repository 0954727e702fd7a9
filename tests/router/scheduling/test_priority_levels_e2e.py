"""Priority levels on a real group, as Triton's qa/L0_model_queue test_max_priority_levels sets them: a model with
``priority_levels`` 2^64 - 1 and its default level past 2^32 loads (Triton keeps a queue per level in use, not
per level declared), and a request at level 1 is served before those at the default level. The three requests
are queued together by ``TRITONSERVER_DELAY_SCHEDULER=3``, each sent once the one before it is queued (two
requests of one level run in the order they reached the router, and concurrent gRPC calls may reach it in
either); the ``position`` model answers each row with its place in the batch it ran in."""

from __future__ import annotations

import os
import queue

import numpy as np
import tritonclient.grpc as grpcclient

from conveyor.router.scheduling.delay_hooks import DELAY_ENV
from tests.support.group import start_server
from tests.support.metrics import scrape
from tests.support.models import position
from tests.support.waiting import eventually

LEVEL = "e2e"

MODEL = "pos"
WAIT_S = 60.0  # generous: only reached when something is broken
DEFAULT_LEVEL = 2**32  # past any uint32


def test_a_high_priority_request_is_served_first_among_as_many_levels_as_a_uint64_holds(tmp_path: object) -> None:
    repo = os.path.join(str(tmp_path), "repo")
    position(repo, MODEL, f"preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 100000 "
                          f"priority_levels: {2**64 - 1} default_priority_level: {DEFAULT_LEVEL}")
    server = start_server(repo, f"pl{os.getpid()}", "--workers", "1", env={**os.environ, DELAY_ENV: "3"})
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: dict[str, queue.Queue[object]] = {}

    def send(name: str, rows: int, priority: int) -> None:
        data = grpcclient.InferInput("INPUT0", [rows, 1], "INT32")
        data.set_data_from_numpy(np.ones((rows, 1), np.int32))
        answers[name] = box = queue.Queue[object]()
        client.async_infer(MODEL, [data], lambda result, error: box.put(error or result.as_numpy("OUTPUT0")),
                           priority=priority)

    def queued() -> float:
        return scrape(server)[f'nv_inference_pending_request_count{{model="{MODEL}",version="1"}}']

    def places(name: str) -> list[int]:
        return np.asarray(answers[name].get(timeout=WAIT_S)).reshape(-1).tolist()

    try:
        send("default", 2, 0)
        eventually(lambda: queued() == 1, WAIT_S, what="the first request queued", interval=0.05)
        send("default too", 1, DEFAULT_LEVEL)
        eventually(lambda: queued() == 2, WAIT_S, what="the second request queued", interval=0.05)
        send("first", 2, 1)
        # Level 1 before the default level: its 2 rows and the first 2 of the default level make the preferred 4.
        assert places("first") == [1, 2]
        assert places("default") == [3, 4]
        assert places("default too") == [1]  # alone, after its queue delay
    finally:
        client.close()
        assert server.stop() == 0
