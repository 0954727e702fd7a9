"""``ensemble_scheduling.max_inflight_requests``: Triton's back-pressure inside an ensemble.

With a limit N > 0, at most N requests of each step are in flight at once, over all the requests
of that ensemble version (core's StepInflightRequestLimiter, one per step): a decoupled producer
cannot flood the steps after it. A step over the limit waits in order for a slot, which its step's
final response frees. Triton blocks a thread that waits (and, after a fixed wait, proceeds to avoid a
deadlock); the router's waiting step is an entry in a queue, so nothing blocks and nothing needs to
proceed over the limit. Without a limit (0, the default) an ensemble version has no ``StepLimit``.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.router.observability.stats import EnsembleRequestStats

log = logging.getLogger(__name__)


@dataclass(eq=False)
class StepLimit:
    """One step's slots: in flight, and the step requests waiting for one (step id, request, stats)."""

    limit: int
    inflight: int = 0
    waiting: deque[tuple[int, m.InferRequest, EnsembleRequestStats]] = field(default_factory=deque)


def step_limits(config: mc.ModelConfig) -> list[StepLimit]:
    """One ``StepLimit`` per step of an ensemble version with a limit (logged as Triton logs it); none without."""
    limit = config.ensemble_scheduling.max_inflight_requests
    if limit <= 0:
        return []
    log.info("Ensemble model '%s' configured with max_inflight_requests: %d", config.name, limit)
    return [StepLimit(limit) for _ in config.ensemble_scheduling.step]
