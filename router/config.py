"""The router's settings, parsed and typed: ``Router(config)`` reads a ``RouterConfig`` and hands each
collaborator the slice it reads (model control to the lifecycle, client shared memory to its registry,
tracing to the tracer and the settings hub). ``deploy/compose.py`` builds one from the router's flags."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from conveyor.router.lifecycle import ModelControlConfig
from conveyor.router.observability.trace_settings import TraceConfig
from conveyor.router.scheduling.queue_policy import DEFAULT_QUEUE_CAP
from conveyor.router.scheduling.rate_limiter import ResourceLimit
from conveyor.router.shared_memory.client_regions import ClientShmConfig

# The router's exit code when it could not create the server (Triton's "error: creating server"): a
# repository root it cannot use, or a model that failed to load with --exit-on-error. The supervisor then
# stops the whole group with a failure instead of restarting the router (which would fail again).
CREATE_FAILED_CODE = 3
# Set by the ``tritonserver`` command for its group (its children inherit it): there, as in Triton, a
# repository root the server cannot use with --exit-on-error=false leaves it running, neither live nor
# ready (SERVER_FAILED_TO_INITIALIZE). ``conveyor serve`` stops its start whatever --exit-on-error says.
TRITON_CLI_ENV = "CONVEYOR_TRITON_CLI"


def keeps_running_when_unusable(exit_on_error: bool) -> bool:
    """Whether a root the server cannot use leaves it running (Triton's --exit-on-error=false)."""
    return not exit_on_error and os.environ.get(TRITON_CLI_ENV) == "1"


@dataclass(frozen=True)
class SchedulingConfig:
    """The queues, the response cache and the rate limiter (``--max-queue-size``, ``--cache-config``,
    ``--rate-limit``, ``--rate-limit-resource``)."""

    queue_cap: int = DEFAULT_QUEUE_CAP  # queued requests per model version; 0: no cap
    cache_bytes: int = 0  # the response cache's size; 0: no cache
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
