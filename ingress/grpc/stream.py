"""The request pipelining behind ModelStreamInfer.

A stream carries many requests. Each one starts as soon as it is read, so they
run concurrently. Each is sent to the router only after the one before it was (``SendTurn``), so a
sequence's START is never overtaken. A request to a model that is not decoupled has one reply, and
those replies leave in request order: Triton does the same (its stream handler
writes only the state at the front of its queue), and clients may rely on it.
A decoupled model's replies leave as they are produced, interleaved with the
replies of other requests, as in Triton.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable
from typing import TypeVar

from conveyor.ingress.dataplane import SendTurn

T = TypeVar("T")

# Requests running at once. Past it the reader stops, so HTTP/2 flow control
# pushes back on a client that outruns the models.
DEFAULT_WINDOW = 256


class Replies:
    """Where one request's replies go on the stream, and its turn to be sent to the router
    (``send_turn``: after every earlier request of the stream)."""

    def __init__(self, out: asyncio.Queue[bytes | None], before: asyncio.Future[None],
                 sent_before: asyncio.Future[None] | None = None) -> None:
        self._out = out
        self._before = before  # done once every earlier request's in-order reply has left
        self.turn_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.send_turn = SendTurn(sent_before)

    async def send(self, reply: bytes) -> None:
        """Send now, whatever earlier requests are doing (decoupled models)."""
        await self._out.put(reply)

    async def send_in_order(self, reply: bytes) -> None:
        """Send after the in-order replies of every earlier request."""
        await asyncio.shield(self._before)  # shield: a cancelled request must not cancel the chain
        await self._out.put(reply)
        self.pass_turn()

    def pass_turn(self) -> None:
        """Let later in-order replies go once earlier ones have (idempotent)."""
        if self.turn_done.done():
            return
        if self._before.done():
            self.turn_done.set_result(None)
        else:
            self._before.add_done_callback(lambda _: self.pass_turn())


async def stream_replies(
    requests: AsyncIterable[T], handle: Callable[[T, Replies], Awaitable[None]], window: int = DEFAULT_WINDOW
) -> AsyncGenerator[bytes, None]:
    """Run ``handle`` on each request as it arrives; yield the replies it sends.

    ``handle`` must report failures in its replies (the stream's errors are
    in-band). When the consumer stops early or is cancelled (the client went
    away), every request still running is cancelled.
    """
    out: asyncio.Queue[bytes | None] = asyncio.Queue(window)
    running: set[asyncio.Task[None]] = set()
    reader = asyncio.create_task(_read(requests, handle, out, running, window))
    try:
        while (reply := await out.get()) is not None:
            yield reply
        await reader  # re-raise a failure to read the stream
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()


async def _read(
    requests: AsyncIterable[T],
    handle: Callable[[T, Replies], Awaitable[None]],
    out: asyncio.Queue[bytes | None],
    running: set[asyncio.Task[None]],
    window: int,
) -> None:
    slots = asyncio.Semaphore(window)
    before: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    before.set_result(None)
    sent: asyncio.Future[None] | None = None

    def finished(task: asyncio.Task[None]) -> None:
        running.discard(task)
        slots.release()

    try:
        async for request in requests:
            await slots.acquire()
            replies = Replies(out, before, sent)
            before = replies.turn_done
            sent = replies.send_turn.sent
            task = asyncio.ensure_future(_run(handle, request, replies))
            running.add(task)
            task.add_done_callback(finished)
        if running:
            await asyncio.wait(set(running))
    except asyncio.CancelledError:
        raise
    except BaseException:
        await out.put(None)  # wake the writer, which re-raises this
        raise
    await out.put(None)


async def _run(handle: Callable[[T, Replies], Awaitable[None]], request: T, replies: Replies) -> None:
    try:
        await handle(request, replies)
    finally:
        replies.send_turn.done()  # a request never sent must not hold the later ones back
        replies.pass_turn()  # a request that sent no in-order reply must not hold the later ones
