"""The worker's own request channel to the router, for models' BLS calls.

The worker acts as one more ingress: a DEALER socket on the router's ingress
endpoint sends ``InferRequest``/``Cancel`` and receives ``InferResponse``, so
the callee is queued, batched, counted and placed like any client's request.
Inputs go once into this worker's arena (the callee reads them in place); the
block is freed on the request's final response.

The socket belongs to the worker's main thread (zmq sockets are not thread
safe). A model's thread hands its request over through ``outbox`` and the
worker's wake pipe; the main thread calls each request's ``on_response`` as
responses arrive (it must be quick and must not raise). Control calls (the
callee's signature, model readiness, load/unload from a model) travel the same
way and are answered to their ``on_reply``.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from conveyor.proto import messages as m
from conveyor.proto.control import (
    CONTROL_TIMEOUT_S,
    LOAD_TIMEOUT_S,
    Args,
    ModelVersion,
    RepositoryLoad,
    RepositoryUnload,
    SignatureReply,
)
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.framing import Outbox, drain
from conveyor.proto.pending_calls import OnReply, OnResponse, PendingCalls
from conveyor.shm.arena import Arena

log = logging.getLogger(__name__)



class BlsLink:
    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        arena: Arena,
        arena_lock: threading.Lock,
        wake: Callable[[], None],
    ) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.sock.send(m.encode(m.IngressHello(m.PROTOCOL_VERSION, os.getpid())))
        self.arena = arena
        self.arena_lock = arena_lock  # the arena is shared with the output writers
        self._wake = wake
        self._outbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._out = Outbox(self.sock)
        self._ids = itertools.count(1)
        self._calls = PendingCalls()
        # The router's repository generation, as its last answer said: a change voids
        # the signatures BLS requests are checked against (workers/bls_signatures.py).
        self.generation = 0

    # --- any thread ----------------------------------------------------------------------

    def next_id(self) -> int:
        return next(self._ids)

    def alloc(self, nbytes: int) -> int:
        with self.arena_lock:
            return self.arena.alloc(nbytes)

    def submit(self, request: m.InferRequest, block: int | None, on_response: OnResponse) -> None:
        """Send ``request`` (its inputs in ``block`` of the arena, freed on its final response)."""
        self._calls.add(request.id, on_response, None if block is None else lambda: self._free(block))
        self._outbox.put(m.encode(request))
        self._wake()

    def cancel(self, request_id: int, on_response: OnResponse) -> None:
        """The caller stopped listening: tell the router; later responses go to ``on_response``."""
        if self._calls.redirect(request_id, on_response):
            self._outbox.put(m.encode(m.Cancel(request_id)))
            self._wake()

    def request_cancel(self, request_id: int) -> None:
        """Ask the router to cancel a request whose responses the caller still reads (a
        decoupled BLS iterator's ``cancel()``)."""
        self._outbox.put(m.encode(m.Cancel(request_id)))
        self._wake()

    def control(self, op: str, args: dict[str, Any], on_reply: OnReply) -> int:
        """Send control call ``op``; ``on_reply`` gets the router's ``ControlReply``. Its id."""
        cid = self.next_id()
        self._calls.add_control(cid, on_reply)
        self._outbox.put(m.encode(m.ControlRequest(cid, op, args)))
        self._wake()
        return cid

    def forget_control(self, cid: int) -> None:
        """The caller gave up waiting: a late reply is dropped."""
        self._calls.forget_control(cid)

    def call(self, op: str, args: dict[str, Any], timeout_s: float = CONTROL_TIMEOUT_S) -> Any:
        """Control call ``op`` and wait for its result (never from the main thread).

        Raises the router's error as a ``ConveyorError``, UNAVAILABLE past ``timeout_s``."""
        replies: queue.SimpleQueue[m.ControlReply] = queue.SimpleQueue()
        cid = self.control(op, args, replies.put)
        try:
            reply = replies.get(timeout=timeout_s)
        except queue.Empty:
            self.forget_control(cid)
            raise ConveyorError(Status.UNAVAILABLE, f"the router did not answer '{op}' in time") from None
        if reply.error is not None:
            raise ConveyorError(Status(reply.error.status), reply.error.message)
        return reply.result

    # --- the control ops a model makes: typed by proto/control.py's structs, as the ingress's ---------------

    def signature(self, model: str, version: str = "") -> SignatureReply:
        reply = self.call("signature", _args(ModelVersion(model, version)))
        return SignatureReply(int(reply["generation"]), reply["signature"])

    def model_ready(self, model: str, version: str = "", timeout_s: float = CONTROL_TIMEOUT_S) -> bool:
        return bool(self.call("model_ready", _args(ModelVersion(model, version)), timeout_s))

    def repository_load(self, model: str, config: str = "", files: dict[str, bytes] | None = None,
                        timeout_s: float = LOAD_TIMEOUT_S) -> None:
        self.call("repository_load", _args(RepositoryLoad(model, config, files)), timeout_s)

    def repository_unload(self, model: str, unload_dependents: bool = False,
                          timeout_s: float = CONTROL_TIMEOUT_S) -> None:
        self.call("repository_unload", _args(RepositoryUnload(model, unload_dependents)), timeout_s)

    # --- the main thread -------------------------------------------------------------------

    def flush(self) -> bool:
        """Send what the model threads handed over, as one message; True when it sent. (Called every loop
        turn: ``empty`` asks without the exception an empty ``get_nowait`` raises; this thread alone takes
        from the queue.)"""
        outbox, out = self._outbox, self._out
        if outbox.empty():
            return False  # nothing handed over, nothing in ``out``: only this method fills it, and flushes it
        get = outbox.get_nowait
        while not outbox.empty():
            out.send(get())
        return out.flush()

    def drain(self) -> bool:
        """Deliver every reply waiting; True if more may wait."""
        return drain(self.sock, m.router_reply_decoder.decode, self._on_reply, "the router (BLS)")

    def _on_reply(self, msg: m.RouterToIngress) -> None:
        if isinstance(msg, m.InferResponse):
            if msg.generation:
                self.generation = msg.generation
            self._calls.deliver(msg)
        elif isinstance(msg, m.ControlReply):
            self._calls.deliver_control(msg)
        elif isinstance(msg, m.RepositoryChanged):
            self.generation = msg.generation  # voids the signatures its models' calls are checked against

    def fail_all(self, why: str) -> None:
        """The router restarted: the requests it knew are lost."""
        self._calls.fail_all(m.ErrorInfo(int(Status.UNAVAILABLE), f"{why}; the BLS request's outcome is unknown"))
        self.generation = 0

    def _free(self, block: int) -> None:
        with self.arena_lock:
            self.arena.free(block)

    def close(self) -> None:
        self.sock.close(0)


def _args(args: Args) -> dict[str, Any]:
    return msgspec.structs.asdict(args)
