"""The listening side: a method table, the connections, start and graceful stop."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from conveyor.ingress.grpc.h2.connection import H2Connection


class H2Server:
    """Serves ``handlers`` (``"/package.Service/Method"`` -> ``grpc.RpcMethodHandler``).

    ``restrictions`` maps a method path to (header, value, message): the call
    runs only with that metadata, else it is refused UNAVAILABLE with the message."""

    def __init__(self, handlers: dict[str, Any], restrictions: dict[str, tuple[str, str, str]] | None = None) -> None:
        self.handlers = handlers
        self.restrictions = restrictions or {}
        self.connections: set[H2Connection] = set()
        self._listener: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen (SO_REUSEPORT: other ingress processes may share the port); return the bound port."""
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            lambda: H2Connection(self), host or None, port, reuse_port=True, backlog=1024,
        )
        sock: socket.socket = self._listener.sockets[0]
        return int(sock.getsockname()[1])

    async def stop(self, grace: float | None) -> None:
        """Stop listening, send GOAWAY, let running calls finish for up to
        ``grace`` seconds (None: none), then close every connection."""
        if self._listener is not None:
            self._listener.close()
        for conn in list(self.connections):
            conn.goaway()
        if grace:
            loop = asyncio.get_running_loop()
            until = loop.time() + grace
            while any(not c.idle for c in self.connections) and loop.time() < until:
                await asyncio.sleep(0.05)
        tasks = []
        for conn in list(self.connections):
            tasks += conn.abort_calls()
            conn.close()
        if tasks:  # cancelled: they end before the caller closes what they use
            await asyncio.wait(tasks, timeout=5.0)
