"""The records the lifecycle's parts pass each other: the control mode and the model control settings
(``ModelControlConfig``), a load to prepare (``Prep``) and why, a load call waiting for its model
(``LoadWaiter``), and the answers ``settle`` hands the router."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError
from conveyor.router.models import Instance
from conveyor.router.repository.agent import DEFAULT_LOAD_THREADS
from conveyor.router.repository.backend_config import BackendConfig


class ControlMode(enum.Enum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


@dataclass(frozen=True)
class ModelControlConfig:
    """What the router loads, when, from which files, and what a failed load means (the model control
    flags, parsed: ``--model-control-mode``, ``--load-model``, ...; deploy/compose.py builds it). The
    lifecycle reads the loading half; the router its poll interval and ``exit_on_error``, the control handler
    ``strict_readiness``, the repository agent ``load_threads``, worker membership ``load_retries``."""

    mode: ControlMode = ControlMode.NONE
    load_at_start: tuple[str, ...] = ()  # --load-model (explicit mode; "*": every model)
    strict_config: bool = False  # never complete a config from the model file
    config_name: str = ""  # --model-config-name
    backend_config: BackendConfig = field(default_factory=BackendConfig)
    namespacing: bool = False  # --model-namespacing (router/spec/namespaces.py)
    poll_secs: float = 15.0  # poll mode's rescan interval
    exit_on_error: bool = False  # a failed start-up load stops the router (CREATE_FAILED_CODE)
    strict_readiness: bool = False  # ready only while every model is
    load_retries: int = 0  # --model-load-retry-count
    load_threads: int = DEFAULT_LOAD_THREADS  # --model-load-thread-count (router/repository/agent.py)
    # An unload waits for a load of its model in progress (tritonserver, as Triton); else it cancels the load.
    unload_waits_for_load: bool = False


@dataclass(eq=False)
class LoadWaiter:
    """A load call to answer once its model has settled (``reply_to``: an opaque handle of the router's)."""

    name: str  # the registry key its answer is about (the name asked, until the repository was looked at)
    reply_to: Any
    resolved: bool = False  # the repository was looked at: the keys it loads are known
    keys: set[str] = field(default_factory=set)  # every model whose preparation the answer waits for
    on_disk: dict[str, str] = field(default_factory=dict)  # what it found: its ensemble's composing models


@dataclass(eq=False)
class DeferredUnload:
    """An unload that waits for the loads of its model in progress when it came (``unload_waits_for_load``)."""

    name: str
    dependents: bool
    waiters: list[LoadWaiter]  # the load calls it waits for ([]: a load without a call, a poll's)


@dataclass(slots=True)
class Answer:
    """A reply to a call the router answers later: an error, or a result (None: an empty reply)."""

    reply_to: Any
    error: ConveyorError | None = None
    result: Any = None


@dataclass
class Settled:
    answers: list[Answer] = field(default_factory=list)
    unload: list[Instance] = field(default_factory=list)
    # Instances an update in place removes from a version that stays loaded: unloaded without Triton's
    # "successfully unloaded" line, and their worker says when they are closed.
    shrink: list[Instance] = field(default_factory=list)


class Why(enum.Enum):
    STARTUP = "startup"
    POLL = "poll"
    LOAD = "load"
    COMPOSING = "composing"  # an ensemble's composing model, loaded with it


@dataclass(eq=False)
class Prep:
    """A model's load to be prepared by the agent, as the loop asked for it."""

    key: str
    path: str  # the model directory ("" when ``files`` are written into one of its own)
    why: Why
    override: mc.ModelConfig | None = None
    files: dict[str, bytes] | None = None
    waiter: LoadWaiter | None = None
    error: str = ""  # known unavailable already (a name two repositories hold): only fingerprinted
    epoch: int = 0  # the model's epoch when asked: an unload since makes the result stale
    composing: bool = False  # loaded for an ensemble that uses it, not by its own name (Triton's explicitly_load_)
