"""One gRPC call's HTTP/2 stream: its state on both sides, and the request
messages of a client-streaming call as an async iterator."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from conveyor.ingress.grpc.h2_server.context import CallContext
from conveyor.ingress.grpc.h2_server.messages import MessageReader
from conveyor.ingress.grpc.h2_server.metadata import Headers, RequestHead


class Inbox:
    """The request messages of a streaming call, deserialized as the handler reads them.
    ``taken(size)`` tells the connection a message left (its bytes are the handler's now:
    the stream's budget and flow-control credit are given back), so a handler that stops
    reading stops its client."""

    __slots__ = ("_ended", "_items", "_parse", "_taken", "_waiter")

    def __init__(self, parse: Callable[[bytes], Any] | None, taken: Callable[[int], None]) -> None:
        self._items: deque[tuple[Any, int]] = deque()  # (message, its size on the wire)
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._parse = parse
        self._taken = taken

    def __len__(self) -> int:
        return len(self._items)

    def put(self, message: Any, wire_size: int) -> None:
        self._items.append((message, wire_size))
        self._wake()

    def end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self) -> Any:
        while not self._items:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        message, wire_size = self._items.popleft()
        self._taken(wire_size)
        return self._parse(message) if self._parse is not None else message


class Running(Protocol):
    """What runs a call (``Stream.task``): its task, or what waits for its answer without one
    (``calls.Direct``). ``cancel`` stops it (the stream was reset, the connection lost, the server stops)."""

    def cancel(self, msg: Any | None = None) -> bool: ...

    def done(self) -> bool: ...


class Stream:
    """A call on the connection, from its HEADERS to its trailers or reset."""

    __slots__ = (
        "backlog",
        "backlog_bytes",
        "ctx",
        "deferred",
        "drained",
        "expired",
        "handler",
        "head",
        "headers_sent",
        "held",
        "id",
        "inbox",
        "local_closed",
        "reader",
        "remote_closed",
        "request",
        "task",
        "timer",
        "trailer",
    )

    def __init__(self, stream_id: int, head: RequestHead, handler: Any, ctx: CallContext, limit: int) -> None:
        self.id = stream_id
        self.head = head
        self.handler = handler  # grpc.RpcMethodHandler
        self.ctx = ctx
        self.task: Running | None = None  # an asyncio.Task, or a direct call's stand-in
        self.inbox: Inbox | None = None  # streaming requests only
        self.request: Any = None  # unary: the one message (bytes-like)
        self.reader = MessageReader(limit)
        self.held = 0  # bytes of request messages held for this call, charged to the budgets
        self.deferred = 0  # bytes received and not yet credited back (a streaming call's handler is behind)
        self.backlog: deque[memoryview] | None = None  # DATA waiting for the client's flow-control window (made by
        # the first message that waits: a unary answer sent whole needs none)
        self.backlog_bytes = 0
        self.trailer: Headers | None = None  # trailers waiting behind the backlog
        self.headers_sent = False
        self.remote_closed = False
        self.local_closed = False
        self.expired = False
        self.timer: asyncio.TimerHandle | None = None
        self.drained: asyncio.Future[None] | None = None  # a streaming writer waiting for the backlog
