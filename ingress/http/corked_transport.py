"""A transport that sends what one event-loop turn writes to a connection as one write.

uvicorn writes a response's head and its body with two ``transport.write`` calls, and
uvloop sends each at once: two ``write`` syscalls and two TCP segments per response,
which the client also wakes up for twice. py-spy put those two syscalls at about a fifth
of the HTTP ingress's CPU at c=16 (docs/PERFORMANCE.md). Holding the writes of a turn
and handing them to ``writelines`` at its end sends them as one ``writev``, without
copying the body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class CorkedTransport:
    """Wraps a transport: ``write`` collects, the loop's next turn flushes; the rest passes through."""

    __slots__ = ("_held", "_loop", "_transport", "on_close")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes | bytearray | memoryview] = []
        # Asked on close(): True when the protocol closes later itself (``protocol.py``'s lingering close).
        self.on_close: Callable[[], bool] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        held = self._held
        if not held:
            return
        self._held = []
        if self._transport.is_closing():
            return
        if len(held) == 1:
            self._transport.write(held[0])
        else:
            self._transport.writelines(held)

    def send_now(self, head: bytes, body: bytes) -> None:
        """A whole response, written at once (one ``writev``) after whatever is held."""
        if self._held:
            self.flush()
        transport = self._transport
        if not transport.is_closing():
            transport.writelines((head, body))

    # What the protocols ask on every request: a method here, not a ``__getattr__`` miss.
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(data) for data in self._held)

    def close(self) -> None:
        self.flush()  # what was written before close() still goes out, as with a plain transport
        if self.on_close is not None and self.on_close():
            return
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
