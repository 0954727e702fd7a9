"""``--sequence-slot-padding`` on a real group: a direct sequence batch runs as Triton's does, one row per slot up
to the highest slot in use, the empty ones as not-ready rows that count in the batch-size statistics but not as
inferences (Triton's null requests; qa/L0_sequence_batcher's check_status asserts those sizes). The implicit state
of the real rows is kept through the padding. Without the flag only the occupied slots run (batches of 1 here)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.group import start_server
from tests.support.sequence_models import accumulator, python_accumulator, variable_accumulator

LEVEL = "e2e"

MODEL = "acc"
WAIT_S = 60.0  # generous: only reached when something is broken


@pytest.mark.parametrize(("padding", "python"), [(True, False), (False, False), (True, True)])
def test_a_sequence_alone_in_a_higher_slot_runs_with_the_empty_slots_below_it(tmp_path: object, padding: bool,
                                                                              python: bool) -> None:
    repo = os.path.join(str(tmp_path), "repo")
    if python:  # a request backend: a not-ready request of its own in each empty slot, as Triton's null request
        python_accumulator(repo, MODEL)  # its running sums by correlation id
    else:
        accumulator(repo, MODEL, "direct { }", instances=1)  # OUTPUT = INPUT + STATE (implicit state), 4 slots
    server = start_server(repo, f"sp{os.getpid()}{int(padding)}{int(python)}", "--workers", "1",
                          f"--sequence-slot-padding={str(padding).lower()}")
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=WAIT_S)

    def step(sid: int, value: int, *, start: bool = False, end: bool = False) -> int:
        data = httpclient.InferInput("INPUT", [1, 1], "INT32").set_data_from_numpy(np.array([[value]], np.int32))
        result = client.infer(MODEL, [data], sequence_id=sid, sequence_start=start, sequence_end=end)
        return int(result.as_numpy("OUTPUT").reshape(-1)[0])

    try:
        # One request at a time: sequence 1 holds slot 0, sequence 2 slot 1; each batch is one request.
        sums = [step(1, 1, start=True), step(2, 10, start=True), step(2, 20), step(1, 2),
                step(2, 5, end=True), step(1, 3, end=True)]
        assert sums == [1, 10, 30, 3, 35, 6]  # each sequence's state, kept through the padded batches
        stats = client.get_inference_statistics(MODEL)["model_stats"][0]
        sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
        # Sequence 2's batches run as 2 rows (slot 0 not ready) with the flag, as 1 without.
        assert sizes == ({1: 3, 2: 3} if padding else {1: 6})
        assert (stats["inference_count"], stats["execution_count"]) == (6, 6)
    finally:
        client.close()
        assert server.stop() == 0


def test_an_empty_slots_row_has_a_state_shaped_as_the_batchs(tmp_path: object) -> None:
    """A variable-shaped state grows past its initial [1] (qa/L0_implicit_state's test_ragged_batch): an empty slot's
    row gets zeros shaped as the first request's state, as Triton's null request, so the batch's states agree."""
    repo = os.path.join(str(tmp_path), "repo")
    variable_accumulator(repo, MODEL)
    server = start_server(repo, f"sv{os.getpid()}", "--workers", "1", "--sequence-slot-padding=true")
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=WAIT_S)

    def step(sid: int, values: list[int], *, start: bool = False, end: bool = False) -> list[int]:
        data = httpclient.InferInput("INPUT", [1, len(values)], "INT32")
        data.set_data_from_numpy(np.array([values], np.int32))
        result = client.infer(MODEL, [data], sequence_id=sid, sequence_start=start, sequence_end=end)
        return [int(v) for v in result.as_numpy("OUTPUT").reshape(-1)]

    try:
        assert step(1, [1, 2], start=True) == [1, 2]  # slot 0
        assert step(2, [10, 20], start=True) == [10, 20]  # slot 1: slot 0's row is not ready
        assert step(2, [1, 1]) == [11, 21]  # its state is [1, 2] now: so is the padded row's
        assert step(1, [5, 5], end=True) == [6, 7]
        assert step(2, [1, 1], end=True) == [12, 22]
    finally:
        client.close()
        assert server.stop() == 0
