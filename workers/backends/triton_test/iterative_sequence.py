"""``backend: "iterative_sequence"`` (Triton's src/test/iterative_sequence), a decoupled model for
``sequence_batching { iterative_sequence: true }``: ``INPUT`` = [n] (INT32) gives n responses, 0.5 s
apart, ``OUTPUT`` counting down n-1, ..., 0, the last with the final flag.

Triton's backend answers once per execution and releases the request with the RESCHEDULE flag
until it is done; Conveyor runs the request's executions back to back in one call, as it does
for a Python model that reschedules its requests (docs/PYTHON-BACKEND.md). Under any other
scheduler a request that needs a second execution ends with Triton's error for a release it cannot
reschedule. CPU instances only.
"""

from __future__ import annotations

import time

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import invalid_arg
from conveyor.workers.backends.base import AnsweredLater, RequestItem, RequestOutcome
from conveyor.workers.backends.triton_test.replies import Replies

STEP_S = 0.5  # the C++ backend's wait before each release of the request
NOT_RESCHEDULED = ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
                   "configured to handle such a flag.")


class IterativeSequenceBackend:
    def __init__(self, config: mc.ModelConfig, device: str = "cpu") -> None:
        if device.startswith("cuda"):
            raise invalid_arg("'iterative_sequence' backend only supports CPU instances")
        self._shape = (1, 1) if config.max_batch_size > 0 else (1,)
        self._decoupled = config.model_transaction_policy.decoupled
        # Only ``sequence_batching { iterative_sequence: true }`` takes a request back to run it again.
        self._reschedules = config.HasField("sequence_batching") and config.sequence_batching.iterative_sequence

    def execute_requests(self, items: list[RequestItem]) -> list[RequestOutcome]:
        # Each round answers every request still going once, as one execution of the rescheduled batch would.
        going = [(Replies(item, self._decoupled), int(item.inputs["INPUT"].reshape(-1)[0])) for item in items]
        while going:
            later = []
            for replies, remaining in going:
                remaining -= 1
                time.sleep(STEP_S)
                if remaining > 0 and not self._reschedules:  # Triton's core refuses the release: it answers that
                    replies.send(invalid_arg(NOT_RESCHEDULED), final=True)
                    continue
                done = remaining <= 0
                replies.send({"OUTPUT": np.full(self._shape, remaining, np.int32)}, final=done)
                if not done:
                    later.append((replies, remaining))
            going = later
        return [] if self._decoupled else [AnsweredLater() for _ in items]

    def close(self) -> None:
        pass
