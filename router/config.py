"""The router's settings, parsed and typed: ``Router(config)`` reads a ``RouterConfig`` and hands each
collaborator the slice it reads (model control to the lifecycle, client shared memory to its registry,
tracing to the tracer and the settings hub). ``deploy/compose.py`` builds one from the router's flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.router.lifecycle import ModelControlConfig
from conveyor.router.observability.trace_settings import TraceConfig
from conveyor.router.scheduling.queue_policy import DEFAULT_QUEUE_CAP
from conveyor.router.scheduling.rate_limiter import ResourceLimit
from conveyor.router.shared_memory.client_regions import ClientShmConfig


@dataclass(frozen=True)
class SchedulingConfig:
    """The queues, the response cache and the rate limiter (``--max-queue-size``, ``--cache-config``,
    ``--sequence-slot-padding``, ``--rate-limit``, ``--rate-limit-resource``)."""

    queue_cap: int = DEFAULT_QUEUE_CAP  # queued requests per model version; 0: no cap
    cache_bytes: int = 0  # the response cache's size; 0: no cache
    sequence_slot_padding: bool = False  # direct sequence batches pad their empty slots, as Triton's
    rate_limit: bool = False  # --rate-limit execution_count
    rate_limit_resources: tuple[ResourceLimit, ...] = ()  # explicit counts; the rest: what instances ask for


@dataclass(frozen=True)
class StopConfig:
    """How the router stops on SIGTERM (``--exit-timeout-secs``, ``--drain-grace-secs``)."""

    exit_timeout_s: float = 30.0  # in-flight requests' time to finish
    drain_grace_s: float = 0.0  # not ready, still serving, before new requests are refused


@dataclass(frozen=True)
class RouterConfig:
    """Everything the router reads. ``ingress_endpoint`` and ``worker_endpoint``: where its two ROUTER sockets
    bind; ``spin_s``: how long to spin on them before each blocking poll (None: ``spin_seconds()``)."""

    repositories: tuple[str, ...]
    ingress_endpoint: str
    worker_endpoint: str
    group: str = "default"
    spin_s: float | None = None
    models: ModelControlConfig = field(default_factory=ModelControlConfig)
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    client_shm: ClientShmConfig = field(default_factory=ClientShmConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    stop: StopConfig = field(default_factory=StopConfig)
