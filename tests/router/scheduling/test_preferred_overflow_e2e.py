"""The dynamic batcher on a real group, as Triton's ``GetDynamicBatch`` forms batches (Triton's qa/L0_batcher
test_multi_batch_sum_gt_max_preferred): the batch that the next request would push past every preferred size
leaves at once, as if it were a preferred one, and that request waits for a batch of its own. The two requests
are queued together by ``TRITONSERVER_DELAY_SCHEDULER=2``; the ``position`` model answers each row with its place
in the batch it ran in."""

from __future__ import annotations

import os
import queue

import numpy as np
import tritonclient.grpc as grpcclient

from conveyor.router.scheduling.delay_hooks import DELAY_ENV
from tests.support.group import start_server
from tests.support.models import position

LEVEL = "e2e"

MODEL = "pos"
WAIT_S = 60.0  # generous: only reached when something is broken


def test_a_batch_that_would_outgrow_the_preferred_sizes_leaves_without_the_next_request(tmp_path: object) -> None:
    repo = os.path.join(str(tmp_path), "repo")
    # max_batch_size 4, preferred [2]: 1 row then 2 rows would make 3, past 2.
    position(repo, MODEL, "preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 100000")
    server = start_server(repo, f"po{os.getpid()}", "--workers", "1", env={**os.environ, DELAY_ENV: "2"})
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[object] = queue.Queue()

    def send(rows: int) -> None:
        data = grpcclient.InferInput("INPUT0", [rows, 1], "INT32")
        data.set_data_from_numpy(np.ones((rows, 1), np.int32))
        client.async_infer(MODEL, [data], lambda result, error: answers.put(error or result.as_numpy("OUTPUT0")))

    try:
        send(1)
        send(2)
        places = sorted(np.asarray(answers.get(timeout=WAIT_S)).reshape(-1).tolist() for _ in range(2))
        # Two batches: the 1 row alone, the 2 rows together (one batch of 3 would answer [1] and [2, 3]).
        assert places == [[1], [1, 2]]
    finally:
        client.close()
        assert server.stop() == 0
