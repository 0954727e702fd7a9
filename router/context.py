"""What the router's handlers share: its two outboxes, the registry and the worker
pool, where requests are, and the memory it holds; built once by ``Router``."""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.proto.framing import PeerOutbox
from conveyor.router.ledger import Ledger
from conveyor.router.observability.tracing import Tracer
from conveyor.router.pool import WorkerPool
from conveyor.router.registry import ModelRegistry
from conveyor.router.replies import Replies
from conveyor.router.response_cache import ResponseCache
from conveyor.router.scheduling.rate_limiter import RateLimiter
from conveyor.router.shared_memory.held_blocks import HeldBlocks
from conveyor.router.shared_memory.loans import Loans


@dataclass(frozen=True, slots=True, eq=False)
class RouterContext:
    front: PeerOutbox  # to ingress processes (and BLS links)
    back: PeerOutbox  # to workers
    registry: ModelRegistry
    pool: WorkerPool
    ledger: Ledger
    replies: Replies
    tracer: Tracer
    holds: HeldBlocks  # blocks of other processes the router keeps alive
    loans: Loans  # release flags it lends with them
    limiter: RateLimiter | None = None  # --rate-limit; None: off, nothing to pay
    cache: ResponseCache | None = None  # --cache-config; None: off
