"""The ingress side of the ingress<->router ZeroMQ link (DEALER, asyncio).

Each call gets an id; replies are matched to waiting futures, or, for a
decoupled model's request (``infer_stream``), queued until its final one. A
reply whose waiter has gone (client cancelled) is handed to ``on_orphan`` so
its shared memory is still released.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

import zmq

from conveyor.deploy.log_settings import ProcessLog
from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status, unavailable

log = logging.getLogger(__name__)

CONTROL_TIMEOUT_S = 30.0
# A model load answers once the model is ready: big models take a while.
LOAD_TIMEOUT_S = 600.0
# While requests are in flight the link pings the router this often; a router
# that does not answer within PING_TIMEOUT_S, or answers with another boot id
# (it restarted), has lost those requests: they fail instead of hanging.
PING_INTERVAL_S = 1.0
PING_TIMEOUT_S = 5.0
DRAIN_BATCH = 64  # replies handled per turn of the event loop


def error_from(info: m.ErrorInfo) -> ConveyorError:
    return ConveyorError(Status(info.status), info.message)


class RouterLink:
    def __init__(self, endpoint: str, on_orphan: Callable[[m.InferResponse], None] | None = None) -> None:
        self.endpoint = endpoint
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)  # never refuse a send: in-flight requests are bounded elsewhere
        self._sock.connect(endpoint)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_armed = False
        self._ids = itertools.count(1)
        self._infer: dict[int, asyncio.Future[m.InferResponse]] = {}
        self._control: dict[int, asyncio.Future[m.ControlReply]] = {}
        # Streams of responses until the final one; None once their reader left.
        self._streams: dict[int, asyncio.Queue[m.InferResponse] | None] = {}
        self.on_orphan = on_orphan
        self._watch: asyncio.Task[None] | None = None
        self._boot: int | None = None
        # Whether any tracing is on (the router's SettingsUpdate): only then are requests stamped.
        self.tracing = False

    async def start(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        loop.add_reader(self._sock.FD, self._drain)
        self._send(m.encode(m.IngressHello(m.PROTOCOL_VERSION, os.getpid())))
        self._watch = loop.create_task(self._watch_router())

    def _send(self, payload: bytes | memoryview) -> None:
        # SNDHWM 0 and a connected DEALER: the message is queued even while the router is away.
        self._sock.send(payload, zmq.NOBLOCK, copy=False)
        if cast(int, self._sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            self._arm_drain()

    def _arm_drain(self) -> None:
        if not self._drain_armed and self._loop is not None:
            self._drain_armed = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        """Take every reply waiting now (the descriptor fires once per burst)."""
        self._drain_armed = False
        recv = self._sock.recv
        for _ in range(DRAIN_BATCH):
            try:
                frame = recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return  # closed
            self._dispatch(frame)
        self._arm_drain()  # more may wait: let other callbacks run first

    async def _watch_router(self) -> None:
        first = True
        while True:
            if not first:
                await asyncio.sleep(PING_INTERVAL_S)
            first = False  # learn the boot id at once, before any request can be lost
            if not self._infer and not self._streams and self._boot is not None:
                continue
            pending = [*self._infer, *self._streams]
            try:
                boot = await asyncio.wait_for(self.control("ping"), PING_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.fail_in_flight(pending, "the router stopped answering")
                continue
            if self._boot is not None and boot != self._boot:
                self.fail_in_flight(pending, "the router restarted")
            self._boot = boot

    def fail_in_flight(self, ids: list[int], why: str) -> None:
        """Answer these requests with UNAVAILABLE (their memory is freed as usual)."""
        error = m.ErrorInfo(int(Status.UNAVAILABLE), f"{why}; the request's outcome is unknown: retry it")
        for rid in ids:
            fut = self._infer.pop(rid, None)
            if fut is not None and not fut.done():
                log.error("request %d lost: %s", rid, why)
                fut.set_result(m.InferResponse(rid, "", "", error=error))
            elif rid in self._streams:
                log.error("request %d lost: %s", rid, why)
                self._on_stream_response(m.InferResponse(rid, "", "", error=error))

    def trace_end(self, trace_id: int) -> None:
        """Tell the router a traced request's answer is going out now."""
        self._send(m.encode(m.TraceEnd(trace_id, time.time_ns())))

    def next_id(self) -> int:
        return next(self._ids)

    @property
    def in_flight(self) -> int:
        return len(self._infer) + len(self._streams)

    async def infer(self, request: m.InferRequest) -> m.InferResponse:
        """Send ``request``; if the caller is cancelled, tell the router and let the
        eventual reply go to ``on_orphan``."""
        fut: asyncio.Future[m.InferResponse] = asyncio.get_running_loop().create_future()
        self._infer[request.id] = fut
        self._send(m.encode(request))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if not fut.done():
                # The reply still comes (and frees memory); nobody waits for it.
                fut.add_done_callback(self._orphaned)
                self._send(m.encode(m.Cancel(request.id)))
            raise

    async def infer_stream(self, request: m.InferRequest) -> AsyncGenerator[m.InferResponse, None]:
        """Send ``request`` to a decoupled model; yield its responses up to the final
        one. If the caller stops early, tell the router and let the rest of the
        responses go to ``on_orphan``."""
        responses: asyncio.Queue[m.InferResponse] = asyncio.Queue()
        self._streams[request.id] = responses
        final = False
        try:
            self._send(m.encode(request))
            while not final:
                response = await responses.get()
                final = response.final
                yield response
        finally:
            if not final:
                if request.id in self._streams:
                    self._streams[request.id] = None
                self._drain_orphans(responses)
                self._send(m.encode(m.Cancel(request.id)))

    def _drain_orphans(self, responses: asyncio.Queue[m.InferResponse]) -> None:
        while not responses.empty():
            response = responses.get_nowait()
            if self.on_orphan is not None:
                self.on_orphan(response)

    def _on_stream_response(self, msg: m.InferResponse) -> None:
        if msg.id not in self._streams:
            return
        responses = self._streams.pop(msg.id) if msg.final else self._streams[msg.id]
        if responses is not None:
            responses.put_nowait(msg)
        elif self.on_orphan is not None:
            self.on_orphan(msg)

    def _orphaned(self, fut: asyncio.Future[m.InferResponse]) -> None:
        if not fut.cancelled() and self.on_orphan is not None:
            self.on_orphan(fut.result())

    async def control(self, op: str, *, timeout_s: float = CONTROL_TIMEOUT_S, **args: Any) -> Any:
        cid = self.next_id()
        fut: asyncio.Future[m.ControlReply] = asyncio.get_running_loop().create_future()
        self._control[cid] = fut
        self._send(m.encode(m.ControlRequest(cid, op, args)))
        try:
            reply = await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise unavailable("the router did not answer in time") from None
        finally:
            self._control.pop(cid, None)
        if reply.error is not None:
            raise error_from(reply.error)
        return reply.result

    def _dispatch(self, frame: zmq.Frame) -> None:
        try:
            msg = m.router_reply_decoder.decode(frame.buffer)
        except Exception:
            log.exception("undecodable message from the router")
            return
        if isinstance(msg, m.SettingsUpdate):
            ProcessLog.apply_wire(msg.log)
            self.tracing = msg.tracing
            return
        if isinstance(msg, m.InferResponse):
            fut = self._infer.pop(msg.id, None)
            if fut is None:
                self._on_stream_response(msg)
                return
        else:
            fut = self._control.get(msg.id)  # type: ignore[assignment]
        if fut is not None and not fut.done():
            fut.set_result(msg)  # type: ignore[arg-type]

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._loop is not None and not self._sock.closed:
            self._loop.remove_reader(self._sock.FD)
        self._sock.close(0)
