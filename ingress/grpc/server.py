"""The gRPC ingress process: Triton's API on one port, served by the event loop's gRPC server
(``h2_server``: ngh2 or h2, plaintext or TLS, Triton's keepalive flags included) or by grpc.aio when named.

Several ingress processes bind the same port (SO_REUSEPORT) and the kernel
spreads connections over them; each has its own router link and arena.

The process runs on uvloop, and every method is served through the generic
handler table rather than grpc's registered methods: both measured cheaper
per call (docs/PERFORMANCE.md, "gRPC ingress: serving modes measured").
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from typing import Any

import grpc
import uvloop

from conveyor.deploy.runtime.sd_notify import Notifier
from conveyor.ingress.context import DEFAULT_ARENA_BYTES, IngressContext
from conveyor.ingress.grpc import health, service
from conveyor.ingress.grpc.restricted import RestrictedProtocols, method_restrictions
from conveyor.ingress.grpc.tls import GrpcTls
from conveyor.ingress.limits import DEFAULT_GRPC_BUFFER_BYTES, DEFAULT_GRPC_CONNECTION_BUFFER_BYTES, IngressLimits
from conveyor.ingress.restricted import Restriction
from conveyor.ingress.sd_ready import notify_when_serving
from conveyor.proto.triton_cli import stops_listening_at_once

log = logging.getLogger(__name__)

# How often a stop as Triton's logs what it still waits for (Triton's WaitForConnectionsToClose: once a second).
TRITON_STOP_LOG_S = 1.0

# Triton accepts tensors up to protobuf's own 2 GiB message limit.
MAX_MESSAGE_BYTES = (1 << 31) - 1

# Every grpcio server's options; a process's own (the keepalive flags) come with start_server's ``options``.
SERVER_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.so_reuseport", 1),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)


def _address(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    return f"{host}:{port}"


async def start_server(
    ctx: IngressContext, host: str, port: int, *, tls: GrpcTls | None = None,
    restricted: dict[str, Restriction] | None = None, implementation: str = "grpcio",
    buffer_bytes: int = DEFAULT_GRPC_BUFFER_BYTES, connection_buffer_bytes: int = DEFAULT_GRPC_CONNECTION_BUFFER_BYTES,
    options: Sequence[tuple[str, Any]] = (),
) -> tuple[Any, int]:
    """Build, bind and start a gRPC server on ``ctx``; return it and the
    bound port (useful with ``port=0``). The caller stops it (``await server.stop(grace)``).

    ``tls`` serves TLS instead of plaintext; ``restricted`` maps API categories to
    the metadata each needs (``--grpc-restricted-protocol``). ``implementation``
    is ``grpcio`` (grpc.aio), ``h2`` or ``ngh2`` (``h2_server/``, the event loop's
    server, on python-hyper's h2 or on libnghttp2 through ngh2, plaintext or TLS); ``buffer_bytes``
    and ``connection_buffer_bytes`` are that server's budgets for request bytes held
    before their calls take them (``--grpc-max-buffer-bytes``,
    ``--grpc-max-connection-buffer-bytes``); ``options``: grpc channel arguments beyond ``SERVER_OPTIONS``
    (the ``--grpc-keepalive-*`` and ``--grpc-max-connection-age*`` flags; both servers take them)."""
    if implementation in ("h2", "ngh2"):
        return await _start_h2(ctx, host, port, restricted, buffer_bytes, connection_buffer_bytes, implementation,
                               tls, options)
    interceptors = [RestrictedProtocols(restricted)] if restricted else []  # none: nothing on the hot path
    server = grpc.aio.server(options=[*SERVER_OPTIONS, *options], interceptors=interceptors)
    service.add_to_server(service.InferenceServicer(ctx.link, ctx.dataplane, ctx.drain), server)
    health.add_to_server(health.HealthServicer(ctx.link, ctx.drain), server)
    address = _address(host, port)
    bound = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    if bound == 0:  # older grpcio reports a failed bind this way instead of raising
        raise OSError(f"cannot bind the gRPC endpoint to {_address(host, port)}")
    await server.start()
    return server, bound


async def _start_h2(
    ctx: IngressContext, host: str, port: int, restricted: dict[str, Restriction] | None,
    buffer_bytes: int, connection_buffer_bytes: int, engine: str, tls: GrpcTls | None,
    options: Sequence[tuple[str, Any]] = (),
) -> tuple[Any, int]:
    from conveyor.ingress.grpc.h2_server.engine import ngh2_problem
    from conveyor.ingress.grpc.h2_server.limits import Keepalive
    from conveyor.ingress.grpc.h2_server.server import H2Server

    if engine == "ngh2":
        problem = ngh2_problem()  # before the first connection: a foreign libnghttp2 would crash it
        if problem:
            log.error("gRPC: the ngh2 HTTP/2 engine failed its start-up self-test, serving on h2 instead: %s", problem)
            ctx.link.ngh2_failed()  # and /metrics counts it (conveyor_grpc_ngh2_self_test_failures_total)
            engine = "h2"
    servicer = service.InferenceServicer(ctx.link, ctx.dataplane, ctx.drain)
    tables = {
        service.SERVICE: service.handler_table(servicer),
        health.SERVICE: health.handler_table(health.HealthServicer(ctx.link, ctx.drain)),
    }
    handlers = {f"/{name}/{method}": h for name, table in tables.items() for method, h in table.items()}
    server = H2Server(handlers, method_restrictions(restricted) if restricted else None,
                      buffer_bytes=buffer_bytes, connection_buffer_bytes=connection_buffer_bytes, engine=engine,
                      tls=tls.ssl_context() if tls else None, keepalive=Keepalive.from_options(options),
                      direct=service.direct_table(servicer))
    return server, await server.start(host, port)


async def run(
    router: str,
    group: str,
    host: str,
    port: int,
    *,
    arena_bytes: int = DEFAULT_ARENA_BYTES,
    exit_timeout_s: float = 30.0,
    drain_grace_s: float = 0.0,
    limits: IngressLimits | None = None,
    tls: GrpcTls | None = None,
    restricted: dict[str, Restriction] | None = None,
    implementation: str = "grpcio",
    buffer_bytes: int = DEFAULT_GRPC_BUFFER_BYTES,
    connection_buffer_bytes: int = DEFAULT_GRPC_CONNECTION_BUFFER_BYTES,
    options: Sequence[tuple[str, Any]] = (),
) -> None:
    """Serve until SIGTERM/SIGINT, then drain (``ingress/drain.py``): not ready for
    ``drain_grace_s``, then refuse new calls while in-flight ones finish (up to
    ``exit_timeout_s``), then close the context and its arena."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ctx = await IngressContext.create(router, group, arena_bytes, drain_grace_s=drain_grace_s,
                                      exit_timeout_s=exit_timeout_s, limits=limits)
    try:
        server, bound = await start_server(ctx, host, port, tls=tls, restricted=restricted,
                                           implementation=implementation, buffer_bytes=buffer_bytes,
                                           connection_buffer_bytes=connection_buffer_bytes, options=options)
        engine = getattr(server, "engine_name", "grpcio")
        log.info("gRPC ingress listening on %s%s (%s)", _address(host, bound), " (TLS)" if tls else "", engine)
        systemd = Notifier()
        announce = asyncio.create_task(notify_when_serving(ctx.link, lambda: True, systemd))
        stopped = False
        try:
            await stop.wait()
            systemd.stopping("draining")
            if stops_listening_at_once(drain_grace_s):
                await _stop_as_triton(server, ctx, exit_timeout_s)
                stopped = True
            await ctx.drain.run(lambda: ctx.link.in_flight)
        finally:
            announce.cancel()
            if not stopped:
                # GOAWAY: clients reconnect elsewhere; calls not yet at the router get what time is left.
                await server.stop(grace=max(1.0, ctx.drain.clock.time_left()))
    finally:
        await ctx.close()


async def _stop_as_triton(server: Any, ctx: IngressContext, exit_timeout_s: float) -> None:
    """Triton's GracefulStop: the listener closed and GOAWAY sent at once (a new call is "Connection refused"), the
    running calls given the exit timeout, and Triton's line each second while some run. What it counts: the
    connections with calls running (the event loop's server), or the calls at the router (grpc.aio)."""
    ctx.drain.clock.begin()  # a call that still reaches the data plane is refused
    stopping = asyncio.create_task(server.stop(grace=exit_timeout_s))
    connections = getattr(server, "connections", None)

    def busy() -> int:
        if connections is not None:
            return sum(1 for conn in list(connections) if not conn.idle)
        return int(ctx.link.in_flight)

    left = int(exit_timeout_s)
    while not stopping.done() and left > 0:
        found = busy()
        if not found:
            break
        log.info("Timeout %d: Found %d gRPC service connections and inference handlers", left, found)
        await asyncio.wait([stopping], timeout=TRITON_STOP_LOG_S)
        left -= 1
    await stopping


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
    limits: IngressLimits | None = None,
    tls: GrpcTls | None = None,
    restricted: dict[str, Restriction] | None = None,
    implementation: str = "grpcio",
    buffer_bytes: int = DEFAULT_GRPC_BUFFER_BYTES,
    connection_buffer_bytes: int = DEFAULT_GRPC_CONNECTION_BUFFER_BYTES,
    options: Sequence[tuple[str, Any]] = (),
) -> None:
    """Run a gRPC ingress process (blocking).

    Args:
        router: the router's ZeroMQ endpoint.
        group: the deployment's name, used to name this process's shm arena.
        host, port: where to listen; other ingress processes may share the port.
        arena_bytes: size of the shared-memory arena for request tensors.
        log_level: a ``logging`` level name.
        exit_timeout_s: how long in-flight calls may run once new ones are refused.
        drain_grace_s: how long readiness is false before new calls are refused.
        limits: what one request may hold, and how many may be in flight.
        tls: serve TLS (or mutual TLS) instead of plaintext.
        restricted: API category -> the metadata it needs.
        implementation: ``grpcio``, ``h2`` or ``ngh2`` (``start_server``).
        buffer_bytes, connection_buffer_bytes: h2's request buffer budgets (``start_server``).
        options: grpcio's channel arguments beyond ``SERVER_OPTIONS`` (``start_server``).
    """
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(process)d %(name)s %(levelname)s: %(message)s"
    )
    # uvloop: grpc.aio's completion callbacks, tasks and futures cost less on it
    # (about a tenth of the ingress's CPU per call at concurrency 1).
    uvloop.run(run(router, group, host, port, arena_bytes=arena_bytes, exit_timeout_s=exit_timeout_s,
                   drain_grace_s=drain_grace_s, limits=limits, tls=tls, restricted=restricted,
                   implementation=implementation, buffer_bytes=buffer_bytes,
                   connection_buffer_bytes=connection_buffer_bytes, options=options))
