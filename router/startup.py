"""Triton's start-up flags as the router applies them (``--exit-on-error``,
``--strict-readiness``, ``--model-config-name``, ``--model-load-retry-count``,
``--backend-config``, ``--model-namespacing``, ``--model-load-thread-count``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.router.repository.agent import DEFAULT_LOAD_THREADS
from conveyor.router.repository.backend_config import BackendConfig

# The router's exit code when it could not create the server (Triton's "error: creating server"): a
# repository root it cannot use, or a model that failed to load with --exit-on-error. The supervisor then
# stops the whole group with a failure instead of restarting the router (which would fail again).
CREATE_FAILED_CODE = 3


@dataclass
class StartupOptions:
    exit_on_error: bool = False
    strict_readiness: bool = False
    config_name: str = ""
    load_retries: int = 0
    backend_config: BackendConfig = field(default_factory=BackendConfig)
    namespacing: bool = False  # --model-namespacing (router/spec/namespaces.py)
    load_threads: int = DEFAULT_LOAD_THREADS  # --model-load-thread-count (router/repository/agent.py)
