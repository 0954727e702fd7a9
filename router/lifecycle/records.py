"""The records the lifecycle's parts pass each other: the control mode, a load to
prepare (``Prep``) and why, a load call waiting for its model (``LoadWaiter``), and the
answers ``settle`` hands the router."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError
from conveyor.router.models import Instance


class ControlMode(enum.Enum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


@dataclass(eq=False)
class LoadWaiter:
    """A load call to answer once its model has settled (``reply_to``: an opaque handle of the router's)."""

    name: str  # the registry key its answer is about (the name asked, until the repository was looked at)
    reply_to: Any
    resolved: bool = False  # the repository was looked at: the keys it loads are known
    keys: set[str] = field(default_factory=set)  # every model whose preparation the answer waits for
    on_disk: dict[str, str] = field(default_factory=dict)  # what it found: its ensemble's composing models


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
