"""A request waiting in the router: the descriptor, where its answer goes, and
what the scheduler decided about it on arrival."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from conveyor.proto import messages as m
from conveyor.router.observability.stats import EnsembleRequestStats, ModelStats
from conveyor.router.observability.tracing import TraceRecord

if TYPE_CHECKING:
    from conveyor.router.scheduling.overload import Waiting


@dataclass(slots=True)
class Pending:
    ingress: bytes
    request: m.InferRequest
    arrival_ns: int
    rows: int
    shape_key: tuple[object, ...]
    level: int = 0  # its priority level: 1 is the highest; 0 for a model without levels
    timeout_ns: int = 0  # when its queue policy times it out (absolute, monotonic); 0 = never
    ticket: int = 0  # its place in the response order (preserve_ordering)
    sequence: m.SequenceStep | None = None  # its sequence, slot and flags (sequence batching)
    # A step of an ensemble request: its queue and compute times count for the ensemble too, as in Triton.
    ensemble_stats: ModelStats | EnsembleRequestStats | None = None
    trace: TraceRecord | None = None  # sampled for a trace (router/observability/tracing.py)
    responded: bool = False  # a decoupled request has had its first response
    responses: int = 0  # a decoupled request's responses so far: the next one's response_stats index
    last_response_ns: int = 0  # when its latest response reached the router (0: none yet)
    direct: bool = False  # its worker answers the ingress itself (``BatchItem.reply_to``)
    # Engine placement's estimate of the prompt blocks its engine computes for it, until its first
    # response (``scheduling/engine_placement.py``); 0 for every other model.
    prefill_blocks: int = 0
    # What it counts in while it waits for its (first) answer (router/scheduling/overload.py); None after.
    waits: Waiting | None = None

    def expires_ns(self) -> int:
        """The earlier of the client's deadline and the queue timeout; 0 = never."""
        deadline, timeout = self.request.deadline_ns, self.timeout_ns
        if deadline and timeout:
            return min(deadline, timeout)
        return deadline or timeout


def shape_key(request: m.InferRequest, batched: bool) -> tuple[object, ...]:
    """Requests batch together only when every non-batch dimension matches
    (Triton's rule; ``router/scheduling/shape_keys.py`` has the others)."""
    return equal_shapes(request) if batched else ()


def equal_shapes(request: m.InferRequest) -> tuple[object, ...]:
    return tuple([(t.name, t.datatype, *t.shape[1:]) for t in request.inputs])
