"""The worker's settings, parsed and typed: ``Worker(config)`` reads a ``WorkerConfig`` (``deploy/compose.py``
builds one from a worker's flags)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ARENA_BYTES = 256 << 20  # tmpfs pages are only used once touched


@dataclass(frozen=True)
class WorkerConfig:
    """``router_endpoint``: the router's worker endpoint; ``bls_endpoint``: its ingress endpoint, for models'
    BLS requests ("": no BLS); ``exit_timeout_s``: how long a leaving worker lets its requests finish;
    ``spin_s``: how long to spin on the sockets before each blocking poll (None: ``spin_seconds()``)."""

    router_endpoint: str
    group: str = "default"
    arena_bytes: int = DEFAULT_ARENA_BYTES  # the worker's shared-memory arena (--arena-size)
    bls_endpoint: str = ""
    exit_timeout_s: float = 30.0
    spin_s: float | None = None
