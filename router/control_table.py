"""How a ``ControlRequest`` is answered: its op looked up in one table, its ``args``
checked once against the op's argument struct, the typed handler called.

The wire stays ``ControlRequest(id, op, args: dict)`` (ingresses, BLS links and the
CLI send keyword arguments); the table is ``router/control_ops.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from conveyor.proto import messages as m
from conveyor.proto.control import Args
from conveyor.proto.errors import ConveyorError, invalid_arg

A = TypeVar("A", bound=Args)
Caller = tuple[bytes, int]  # (identity, ControlRequest.id): where a deferred answer goes


@dataclass(frozen=True, slots=True)
class Op(Generic[A]):
    """An op answered at once with what ``run`` returns (None: an empty reply)."""

    args: type[A]
    run: Callable[[A], object]


@dataclass(frozen=True, slots=True)
class Deferred(Generic[A]):
    """An op answered later by its handler, which is given the caller (a load answers once
    the model settled); an error it raises is answered at once."""

    args: type[A]
    run: Callable[[A, Caller], None]


class ControlTable:
    def __init__(self, ops: Mapping[str, Op[Any] | Deferred[Any]]) -> None:
        self.ops = dict(ops)

    def handle(self, identity: bytes, msg: m.ControlRequest) -> m.ControlReply | None:
        """The reply to send now; None when the op answers later."""
        try:
            entry, args = self._parsed(msg.op, msg.args)
            if isinstance(entry, Deferred):
                entry.run(args, (identity, msg.id))
                return None
            return m.ControlReply(msg.id, result=entry.run(args))
        except ConveyorError as exc:
            return m.ControlReply(msg.id, error=m.ErrorInfo(int(exc.status), exc.message))

    def call(self, op: str, args: Mapping[str, Any]) -> Any:
        """Run an op answered at once, as ``handle`` would (tests, direct callers):
        ``ConveyorError`` when it fails."""
        entry, parsed = self._parsed(op, args)
        if isinstance(entry, Deferred):
            raise invalid_arg(f"'{op}' answers later: send it as a ControlRequest")
        return entry.run(parsed)

    def _parsed(self, op: str, args: Mapping[str, Any]) -> tuple[Op[Any] | Deferred[Any], Args]:
        entry = self.ops.get(op)
        if entry is None:
            raise invalid_arg(f"unknown control operation '{op}'")
        try:
            return entry, msgspec.convert(args, entry.args)
        except msgspec.ValidationError as exc:
            raise invalid_arg(f"bad arguments for '{op}': {exc}") from None
