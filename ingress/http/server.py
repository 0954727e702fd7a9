"""Run the HTTP ingress: uvicorn (uvloop + httptools) on a socket of our own.

Several ingress processes serve one port: each binds its own listening socket
with SO_REUSEPORT and the kernel spreads new connections across them.

Shutdown (SIGTERM/SIGINT) drains first (``ingress/drain.py``): readiness is
false for ``drain_grace_s`` while requests are still served, then new requests
get 503 until those in flight are done (up to ``exit_timeout_s``). Then uvicorn
closes the listener and its connections (cancelling whatever still runs, which
cancels their router requests), and only then is the context closed, unlinking
this process's shared-memory arena. A second signal skips the drain.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
import uvloop

from conveyor.deploy.runtime.sd_notify import Notifier
from conveyor.ingress.context import IngressContext
from conveyor.ingress.http.app import Infer, build_app
from conveyor.ingress.http.body import BodyLimit, Refusal
from conveyor.ingress.http.edge import KEEP_ALIVE_S, EdgeLimits, EdgeState, fit_open_files
from conveyor.ingress.http.fast_protocol import fast_protocol_class
from conveyor.ingress.http.protocol import CaseKeepingProtocol, HttpToolsProtocol
from conveyor.ingress.limits import DEFAULT_MAX_BODY_BYTES, IngressLimits
from conveyor.ingress.restricted import Restriction
from conveyor.ingress.sd_ready import notify_when_serving
from conveyor.proto.triton_cli import stops_listening_at_once

log = logging.getLogger(__name__)

AppFactory = Callable[[IngressContext], Any]

BACKLOG = 2048
# How often a stop as Triton's logs the connections it still waits for (Triton's HTTPServer::Stop: once a second).
TRITON_STOP_LOG_S = 1.0


def bind_socket(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """A listening TCP socket that other processes may bind to the same port too."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class _DrainingServer(uvicorn.Server):
    """uvicorn whose first SIGTERM/SIGINT starts the drain instead of its own shutdown,
    which follows once the drain is done."""

    def __init__(self, config: uvicorn.Config, ctx: IngressContext, systemd: Notifier,
                 triton_stop: bool = False) -> None:
        super().__init__(config)
        self._ctx = ctx
        # Triton's HTTPServer::Stop first (``_wait_for_connections``): the KServe endpoint under ``tritonserver``.
        self._triton_stop = triton_stop
        self._systemd = systemd
        self._loop = asyncio.get_running_loop()
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_task is not None or not self.started:
            super().handle_exit(sig, frame)  # a second signal, or not serving yet: stop now
            return
        # Runs in the signal handler: hand over to the loop.
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._drain_task is None:
            self._systemd.stopping("draining")
            self._drain_task = self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        if self._triton_stop:
            await self._wait_for_connections()
        # An open connection keeps the grace: a load balancer may still send on it.
        await self._ctx.drain.run(lambda: self._ctx.link.in_flight, lambda: len(self.server_state.connections))
        self.should_exit = True

    async def _wait_for_connections(self) -> None:
        """Triton's HTTPServer::Stop: no new connection is accepted, the open ones are served (requests included)
        until their clients close them or the exit timeout has passed, with Triton's line each second."""
        for server in self.servers:
            server.close()  # the listener only: the connections stay
        left = int(self._ctx.drain.clock.exit_timeout_s)
        while left > 0 and self.server_state.connections:
            log.info("Timeout %d: Found %d HTTP service connections", left, len(self.server_state.connections))
            await asyncio.sleep(TRITON_STOP_LOG_S)
            left -= 1

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.config.is_ssl:
            # Closing a TLS connection waits for the peer's close_notify (asyncio gives it 30 s), which
            # an idle client never sends: uvicorn would hold the stop for its whole graceful timeout,
            # past the group's deadline. The drain is over: idle connections are cut at once.
            for connection in list(self.server_state.connections):
                cycle = getattr(connection, "cycle", None)
                if cycle is None or cycle.response_complete:
                    connection.transport.abort()
        await super().shutdown(sockets)


class _Signals:
    """Stands in for the default SIGTERM/SIGINT handlers while ``serve`` runs.

    uvicorn installs its own handlers while serving and, when it has drained,
    restores the previous ones and re-raises the signal it caught. With the
    defaults that would kill the process before the arena is unlinked; here the
    re-raised signal is only recorded. A signal that arrives while starting up
    is recorded too, and makes the server stop as soon as it has started.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    def __call__(self, sig: int, frame: FrameType | None) -> None:
        self.received.append(sig)

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self) for sig in self.SIGNALS}

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


def serve(
    router: str,
    group: str,
    host: str,
    port: int,
    *,
    arena_bytes: int,
    log_level: str = "warning",
    exit_timeout_s: float = 30.0,
    drain_grace_s: float = 0.0,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    app_factory: AppFactory | None = None,
    limits: IngressLimits | None = None,
    restricted: dict[str, Restriction] | None = None,
    ssl_cert: str = "",
    ssl_key: str = "",
    edge: EdgeLimits | None = None,
    body_refusal: Refusal | None = None,
) -> None:
    """Serve HTTP on ``host:port`` for the router at ``router`` until SIGTERM/SIGINT.

    ``app_factory`` builds the ASGI app from the context (default: the KServe v2
    app; the metrics endpoint passes its own). ``restricted`` maps API categories
    to the header each needs; ``ssl_cert``/``ssl_key`` (PEM files) serve HTTPS.
    ``edge``: what one client may hold of this process (``edge.py``; default its defaults).
    ``body_refusal``: the answer to a Content-Length over ``max_body_bytes`` (default: KServe's).
    Blocking; returns once in-flight requests are done and the context is closed.
    """
    signals = _Signals()
    signals.install()
    try:
        uvloop.run(
            _serve(
                signals,
                router,
                group,
                host,
                port,
                arena_bytes=arena_bytes,
                log_level=log_level,
                exit_timeout_s=exit_timeout_s,
                drain_grace_s=drain_grace_s,
                max_body_bytes=max_body_bytes,
                app_factory=app_factory,
                limits=limits,
                restricted=restricted,
                ssl_cert=ssl_cert,
                ssl_key=ssl_key,
                edge=edge or EdgeLimits(),
                body_refusal=body_refusal,
            )
        )
    finally:
        signals.restore()


async def _serve(
    signals: _Signals,
    router: str,
    group: str,
    host: str,
    port: int,
    *,
    arena_bytes: int,
    log_level: str,
    exit_timeout_s: float,
    drain_grace_s: float,
    max_body_bytes: int,
    app_factory: AppFactory | None,
    limits: IngressLimits | None,
    restricted: dict[str, Restriction] | None,
    ssl_cert: str,
    ssl_key: str,
    edge: EdgeLimits,
    body_refusal: Refusal | None,
) -> None:
    # The context's ZeroMQ socket and futures belong to this loop: create it here.
    ctx = await IngressContext.create(router, group, arena_bytes, drain_grace_s=drain_grace_s,
                                      exit_timeout_s=exit_timeout_s, limits=limits)
    try:
        # Bind only once ready, so the kernel does not hand connections to a process still starting.
        sock = bind_socket(host, port)
        forward = limits is not None and limits.header_forward is not None
        protocol: type[HttpToolsProtocol] = CaseKeepingProtocol if forward else HttpToolsProtocol
        if app_factory is not None:
            inner = app_factory(ctx)
        else:
            inner = build_app(ctx, max_body_bytes=max_body_bytes, restricted=restricted)
            # The plain protocol serves infer requests only: unless inference is restricted (falcon checks
            # the header then) or headers are forwarded, it takes them.
            if "inference" not in (restricted or {}) and not forward:
                protocol = fast_protocol_class(Infer(ctx.dataplane, max_body_bytes), max_body_bytes)
        # This process's limits and connections: every connection's protocol enforces them.
        fit_open_files(edge)
        protocol = type(f"Edge{protocol.__name__}", (protocol,), {"edge": EdgeState(edge)})
        app = BodyLimit(inner, max_body_bytes, ctx.dataplane.arena.capacity, body_refusal)
        config = uvicorn.Config(
            app,
            loop="uvloop",
            http=protocol,
            ws="none",
            lifespan="off",
            interface="asgi3",
            access_log=False,
            proxy_headers=False,  # no X-Forwarded-* rewriting on the hot path
            server_header=False,
            log_config=None,  # log through the process's own logging setup
            log_level=log_level,
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=math.ceil(exit_timeout_s),
            # HTTPS is a Conveyor extension (Triton has no such flags); None serves plain HTTP.
            ssl_certfile=ssl_cert or None,
            ssl_keyfile=ssl_key or None,
        )
        systemd = Notifier()
        server = _DrainingServer(config, ctx, systemd, app_factory is None and stops_listening_at_once(drain_grace_s))
        if signals.received:
            server.should_exit = True
        announce = asyncio.create_task(notify_when_serving(ctx.link, lambda: server.started, systemd))
        try:
            await server.serve(sockets=[sock])
        finally:
            announce.cancel()
            systemd.stopping()
    finally:
        await ctx.close()
