"""The ingress side of the ingress<->router ZeroMQ link (DEALER, asyncio).

Each call gets an id; replies are matched to waiting futures, or, for a
decoupled model's request (``infer_stream``), queued until its final one. A
reply whose waiter has gone (client cancelled) is handed to ``on_orphan`` so
its shared memory is still released.

Replies come two ways: from the router on the DEALER, and straight from the
worker that ran the request on this process's own PULL socket (``reply_to``,
announced in the ``IngressHello``; IPC endpoints only). What a turn of the
event loop sends leaves as one message at the end of the turn
(``proto/framing.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import zmq

from conveyor.deploy.runtime.log_settings import ProcessLog
from conveyor.deploy.runtime.procs import actor_role
from conveyor.proto import messages as m
from conveyor.proto.control import ControlCalls
from conveyor.proto.errors import ConveyorError, Status, WorkerLost, invalid_arg, unavailable
from conveyor.proto.framing import Outbox, drain, readable
from conveyor.proto.pending_calls import PendingCalls

log = logging.getLogger(__name__)

# While requests are in flight the link pings the router this often. A router that answers
# with another boot id (it restarted), or does not answer within PING_TIMEOUT_S and whose
# process is gone, has lost those requests: they fail instead of hanging. A router whose
# process lives is busy, not gone (a loaded host, a paused process): its requests wait, up to
# ROUTER_BUSY_LIMIT_S of silence, past which it is taken as wedged and they fail too.
PING_INTERVAL_S = 1.0
PING_TIMEOUT_S = 5.0
ROUTER_BUSY_LIMIT_S = 60.0
DRAIN_BATCH = 64  # messages taken per socket per turn of the event loop


# "0": every reply comes through the router (to compare, or to rule the direct path out).
DIRECT_REPLIES_ENV = "CONVEYOR_DIRECT_REPLIES"


def reply_endpoint(router_endpoint: str) -> str:
    """Where workers may answer this process directly: an IPC socket beside the router's
    ("" for other transports: then every reply comes through the router)."""
    if not router_endpoint.startswith("ipc://") or os.environ.get(DIRECT_REPLIES_ENV, "1") == "0":
        return ""
    folder = os.path.dirname(router_endpoint[len("ipc://"):])
    return f"ipc://{folder}/ingress-{os.getpid()}.sock"


def router_process_lives(pid: int | None) -> bool:
    """Whether ``pid`` is still a router of this host (a pid the link saw answer; another
    process may have been given the number since, hence the command line)."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X") and actor_role(argv) == "router"


def error_from(info: m.ErrorInfo) -> ConveyorError:
    if info.worker_lost:
        return WorkerLost(info.message)
    return ConveyorError(Status(info.status), info.message)


class _Responses:
    """One streamed request's responses not yet read. Cheaper than an ``asyncio.Queue`` per request
    (one future per wait, none while responses wait), and the reader takes all that wait at once."""

    __slots__ = ("_items", "_loop", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: list[m.InferResponse] = []
        self._waiter: asyncio.Future[None] | None = None

    def put(self, response: m.InferResponse) -> None:
        self._items.append(response)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():  # not cancelled with its reader
                waiter.set_result(None)

    async def take(self) -> list[m.InferResponse]:
        """Every response waiting, in arrival order (at least one: waits for it)."""
        if not self._items:
            self._waiter = self._loop.create_future()
            await self._waiter
        items, self._items = self._items, []
        return items

    def drop(self) -> list[m.InferResponse]:
        items, self._items = self._items, []
        return items


class RouterLink(ControlCalls):
    """The router over ZeroMQ: inference, and the control ops (``RouterClient``, proto/control.py)."""

    def __init__(self, endpoint: str, on_orphan: Callable[[m.InferResponse], None] | None = None) -> None:
        self.endpoint = endpoint
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)  # never refuse a send: in-flight requests are bounded elsewhere
        self._sock.connect(endpoint)
        self._out = Outbox(self._sock)
        self._replies: zmq.Socket[bytes] | None = None
        self.reply_to = reply_endpoint(endpoint)
        if self.reply_to:
            self._replies = zmq.Context.instance().socket(zmq.PULL)
            self._replies.setsockopt(zmq.LINGER, 0)
            self._replies.setsockopt(zmq.RCVHWM, 0)
            # The router's folder, which this process may be the first to need (units start in any order).
            os.makedirs(os.path.dirname(self.reply_to[len("ipc://"):]), exist_ok=True)
            self._replies.bind(self.reply_to)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._drain_armed = False
        self._flush_armed = False
        self._replies_armed = False
        self._ids = itertools.count(1)
        self._calls = PendingCalls()
        self.on_orphan = on_orphan
        # The router's repository generation changed (``RepositoryChanged``): the data plane drops
        # the signatures it keeps.
        self.on_repository_change: Callable[[int], None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._boot: int | None = None
        self._router_pid: int | None = None  # the router's process, from its last answer to a ping
        self._silent_since: float | None = None  # when the router's current silence began
        # Whether any tracing is on (the router's SettingsUpdate): only then are requests stamped.
        self.tracing = False
        # Whether the server is live (the router's SettingsUpdate): false once it failed to initialize.
        self.live = True
        self._ngh2_failed = False  # said in every hello (``ngh2_failed``)

    async def start(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        loop.add_reader(self._sock.FD, self._drain)
        if self._replies is not None:
            loop.add_reader(self._replies.FD, self._drain_replies)
        self._hello()
        self._watch = loop.create_task(self._watch_router())

    def _hello(self) -> None:
        self._send(m.encode(m.IngressHello(m.PROTOCOL_VERSION, os.getpid(), self.reply_to, self._ngh2_failed)))

    def ngh2_failed(self) -> None:
        """This gRPC ingress serves on h2 because ngh2 failed its self-test: tell the router (``/metrics``),
        now and in every later hello."""
        self._ngh2_failed = True
        self._hello()

    def _send(self, payload: bytes) -> None:
        """Queue ``payload`` for the router; the turn's messages leave together when it ends."""
        self._out.send(payload)
        if not self._flush_armed and self._loop is not None:
            self._flush_armed = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_armed = False
        if self._closed:  # a flag: ``Socket.closed`` asks libzmq (a C call per flush)
            return
        # SNDHWM 0 and a connected DEALER: the message is queued even while the router is away.
        self._out.flush()
        # A send can take in the socket's pending commands, the announcement of a reply among them,
        # and so consume the edge-triggered ``FD``: ask now (a ZMQ_EVENTS question, two system calls),
        # unless a drain is already due, which receives until the socket answers "nothing".
        if not self._drain_armed and readable(self._sock):
            self._arm_drain()

    def _arm_drain(self) -> None:
        if not self._drain_armed and self._loop is not None:
            self._drain_armed = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        """Take every reply waiting now (the descriptor fires once per burst)."""
        self._drain_armed = False
        try:
            more = drain(self._sock, m.router_reply_decoder.decode, self._on_reply, "the router", DRAIN_BATCH)
        except zmq.ZMQError:
            return  # closed
        if more:
            self._arm_drain()  # more may wait: let other callbacks run first

    def _drain_replies(self) -> None:
        """Take every response the workers sent straight here."""
        self._replies_armed = False
        assert self._replies is not None
        try:
            more = drain(self._replies, m.router_reply_decoder.decode, self._on_reply, "a worker", DRAIN_BATCH)
        except zmq.ZMQError:
            return  # closed
        if more and not self._replies_armed and self._loop is not None:
            self._replies_armed = True
            self._loop.call_soon(self._drain_replies)

    async def _watch_router(self) -> None:
        first = True
        while True:
            if not first:
                await asyncio.sleep(PING_INTERVAL_S)
            first = False  # learn the boot id at once, before any request can be lost
            if not len(self._calls) and self._boot is not None:
                continue
            pending = self._calls.open_requests()
            try:
                boot, pid = await asyncio.wait_for(self.ping(), PING_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception:
                if self._silent_since is None:
                    self._silent_since = time.monotonic() - PING_TIMEOUT_S
                silent_s = time.monotonic() - self._silent_since
                if silent_s < ROUTER_BUSY_LIMIT_S and router_process_lives(self._router_pid):
                    if silent_s < PING_TIMEOUT_S + PING_INTERVAL_S * 2:  # once per silence
                        log.warning("the router has not answered for %.0f s; its process lives: its "
                                    "requests wait (up to %.0f s)", silent_s, ROUTER_BUSY_LIMIT_S)
                    continue
                self.fail_in_flight(pending, "the router stopped answering")
                continue
            self._silent_since = None
            self._router_pid = pid
            if self._boot is not None and boot != self._boot:
                self.fail_in_flight(pending, "the router restarted")
                self._hello()  # the new router learns where workers may answer us
            self._boot = boot

    def fail_in_flight(self, ids: list[int], why: str) -> None:
        """Answer these requests with UNAVAILABLE (their memory is freed as usual)."""
        error = m.ErrorInfo(int(Status.UNAVAILABLE), f"{why}; the request's outcome is unknown: retry it")
        lost = self._calls.fail(ids, error)
        if lost:
            log.error("%d request(s) lost: %s", len(lost), why)

    def trace_end(self, trace_id: int) -> None:
        """Tell the router a traced request's answer is going out now."""
        self._send(m.encode(m.TraceEnd(trace_id, time.time_ns())))

    def refused(self, model: str, version: str) -> None:
        """Tell the router a request to ``model`` was refused here (counted as REJECTED)."""
        self._send(m.encode(m.Refused(model, version)))

    def next_id(self) -> int:
        return next(self._ids)

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    async def infer(self, request: m.InferRequest) -> m.InferResponse:
        """Send ``request``; if the caller is cancelled, tell the router and let the
        eventual reply go to ``on_orphan``."""
        fut: asyncio.Future[m.InferResponse] = (self._loop or asyncio.get_running_loop()).create_future()

        def resolve(msg: m.InferResponse) -> None:
            if fut.cancelled():
                self._orphan(msg)
            else:
                fut.set_result(msg)

        self.submit(request, resolve)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.cancelled():
                self.abandon(request.id)
            else:
                self._orphan(fut.result())  # it came, but the caller was cancelled before it woke up
            raise

    def submit(self, request: m.InferRequest, on_response: Callable[[m.InferResponse], object]) -> None:
        """Send ``request``; its response goes to ``on_response`` (``infer`` without a future: a
        callback that raises is logged). ``abandon`` it to stop waiting."""
        self._calls.add(request.id, on_response)
        self._send(m.encode(request))

    def abandon(self, rid: int) -> None:
        """Stop waiting for request ``rid``: the router is told, and the reply still comes and goes to
        ``on_orphan`` (which frees its memory)."""
        self._calls.redirect(rid, self._orphan)
        self._send(m.encode(m.Cancel(rid)))

    async def infer_stream(self, request: m.InferRequest) -> AsyncGenerator[m.InferResponse, None]:
        """Send ``request`` to a decoupled model; yield its responses up to the final
        one. If the caller stops early, tell the router and let the rest of the
        responses go to ``on_orphan``."""
        box = self._open_stream(request)
        final = False
        unread: list[m.InferResponse] = []
        try:
            while not final:
                unread = await box.take()
                unread.reverse()
                while unread:
                    response = unread.pop()
                    final = response.final
                    yield response
        finally:
            for response in reversed(unread):  # taken but not read: freed as the others
                self._orphan(response)
            self._close_stream(request.id, box, final)

    async def infer_stream_batches(self, request: m.InferRequest) -> AsyncGenerator[list[m.InferResponse], None]:
        """``infer_stream``, each turn yielding every response that has arrived since the last: a
        reader that fell behind (a slow client, a busy loop) takes them together, in order."""
        box = self._open_stream(request)
        final = False
        try:
            while not final:
                batch = await box.take()
                final = batch[-1].final
                yield batch
        finally:
            self._close_stream(request.id, box, final)

    def _open_stream(self, request: m.InferRequest) -> _Responses:
        box = _Responses(self._loop or asyncio.get_running_loop())
        self._calls.add(request.id, box.put)
        self._send(m.encode(request))
        return box

    def _close_stream(self, rid: int, box: _Responses, final: bool) -> None:
        """The reader stopped: before the final response, the router is told and the rest is orphaned."""
        if final:
            return
        self._calls.redirect(rid, self._orphan)
        for response in box.drop():
            self._orphan(response)
        self._send(m.encode(m.Cancel(rid)))

    def _orphan(self, msg: m.InferResponse) -> None:
        """A response nobody waits for: its memory must still be freed."""
        if self.on_orphan is not None:
            self.on_orphan(msg)

    async def _control(self, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        """Send one ``ControlRequest``; its result, or the router's error raised."""
        cid = self.next_id()
        try:
            frame = m.encode(m.ControlRequest(cid, op, args))
        except OverflowError:
            # A client's JSON body (settings, parameters) may hold an integer of any size; MessagePack
            # carries 64 bits: a client's mistake, answered before anything waits for the router.
            raise invalid_arg("a number in the request is outside the 64-bit integer range") from None
        fut: asyncio.Future[m.ControlReply] = asyncio.get_running_loop().create_future()

        def resolve(reply: m.ControlReply) -> None:
            if not fut.done():  # not timed out
                fut.set_result(reply)

        self._calls.add_control(cid, resolve)
        self._send(frame)
        try:
            reply = await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise unavailable("the router did not answer in time") from None
        finally:
            self._calls.forget_control(cid)
        if reply.error is not None:
            raise error_from(reply.error)
        return reply.result

    def _on_reply(self, msg: m.RouterToIngress) -> None:
        if type(msg) is m.InferResponse:  # nearly every message: asked first
            if not self._calls.deliver(msg):
                self._orphan(msg)  # as below
            return
        if isinstance(msg, m.SettingsUpdate):
            ProcessLog.apply_wire(msg.log)
            self.tracing = msg.tracing
            self.live = msg.live
            return
        if isinstance(msg, m.RepositoryChanged):
            if self.on_repository_change is not None:
                self.on_repository_change(msg.generation)
            return
        if isinstance(msg, m.InferResponse):
            if not self._calls.deliver(msg):
                # A late answer to a request that ended otherwise (failed over, or answered both by
                # the router and its worker around a worker's exit): only its memory is left to free.
                self._orphan(msg)
        else:
            self._calls.deliver_control(msg)

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        closed, self._closed = self._closed, True
        if self._loop is not None and not closed:
            self._loop.remove_reader(self._sock.FD)
            if self._replies is not None:
                self._loop.remove_reader(self._replies.FD)
        self._sock.close(0)
        if self._replies is not None:
            self._replies.close(0)  # libzmq unlinks the IPC socket file it bound
