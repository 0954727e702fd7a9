"""The listening side: a method table, the connections, the process-wide buffer
budget, start and graceful stop."""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any

from conveyor.ingress.grpc.h2_server.calls import Direct
from conveyor.ingress.grpc.h2_server.connection import GrpcConnection
from conveyor.ingress.grpc.h2_server.engine import engine_class
from conveyor.ingress.grpc.h2_server.limits import TLS_HANDSHAKE_TIMEOUT_S, Keepalive
from conveyor.ingress.grpc.h2_server.messages import ByteBudget
from conveyor.ingress.limits import DEFAULT_GRPC_BUFFER_BYTES, DEFAULT_GRPC_CONNECTION_BUFFER_BYTES


class H2Server:
    """Serves ``handlers`` (``"/package.Service/Method"`` -> ``grpc.RpcMethodHandler``).

    ``restrictions`` maps a method path to (header, value, message): the call
    runs only with that metadata, else it is refused UNAVAILABLE with the message.
    ``buffer_bytes`` and ``connection_buffer_bytes`` bound the request bytes held
    before calls take them, in the process and per connection (0: no bound;
    ``ingress/limits.py``); ``engine``: the HTTP/2 engine, ``h2`` or ``ngh2`` (``engine.ENGINES``);
    ``tls``: serve TLS with this context (``tls.GrpcTls.ssl_context``: ALPN h2, and a connection that did
    not select it is closed), handshakes bounded by ``limits.TLS_HANDSHAKE_TIMEOUT_S``; ``keepalive``: the
    keepalive PINGs, the ping policy and the connections' maximum age (``limits.Keepalive``: Triton's flags);
    ``direct``: unary methods (by path) that may answer a call without a task (``calls.Direct``)."""

    def __init__(self, handlers: dict[str, Any], restrictions: dict[str, tuple[str, str, str]] | None = None, *,
                 buffer_bytes: int = DEFAULT_GRPC_BUFFER_BYTES,
                 connection_buffer_bytes: int = DEFAULT_GRPC_CONNECTION_BUFFER_BYTES, engine: str = "h2",
                 tls: ssl.SSLContext | None = None, keepalive: Keepalive | None = None,
                 direct: dict[str, Direct] | None = None) -> None:
        self.handlers = handlers
        self.direct = direct or {}
        self.restrictions = restrictions or {}
        self.connections: set[GrpcConnection] = set()
        self.budget = ByteBudget(buffer_bytes)
        self.connection_buffer_bytes = connection_buffer_bytes
        self.engine = engine_class(engine)  # resolved once: each connection makes its own
        self.engine_name = engine
        self.tls = tls
        self.keepalive = keepalive or Keepalive()
        self._listener: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen (SO_REUSEPORT: other ingress processes may share the port); return the bound port."""
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            lambda: GrpcConnection(self), host or None, port, reuse_port=True, backlog=1024,
            ssl=self.tls, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if self.tls else None,
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
        else:  # a direct call's cancel is queued for the router (sent at the end of a loop turn): let it leave
            await asyncio.sleep(0)
