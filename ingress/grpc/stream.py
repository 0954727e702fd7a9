"""The request pipelining behind ModelStreamInfer.

A stream carries many requests. Each one starts as soon as it is read, so they
run concurrently, but replies leave in request order: Triton does the same for
models that are not decoupled (its stream handler writes only the state at
the front of its queue), and clients may rely on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# Requests read ahead of the reply being awaited. Past it the reader stops, so
# HTTP/2 flow control pushes back on a client that outruns the models.
DEFAULT_WINDOW = 256


async def ordered_replies(
    requests: AsyncIterable[T], handle: Callable[[T], Awaitable[bytes]], window: int = DEFAULT_WINDOW
) -> AsyncGenerator[bytes, None]:
    """Run ``handle`` on each request as it arrives; yield the replies in order.

    ``handle`` must report failures in its reply (the stream's errors are
    in-band). When the consumer stops early or is cancelled (the client went
    away), every request still running is cancelled.
    """
    pending: asyncio.Queue[asyncio.Task[bytes] | None] = asyncio.Queue(window)
    reader = asyncio.create_task(_read(requests, handle, pending))
    try:
        while (task := await pending.get()) is not None:
            yield await task
        await reader  # re-raise a failure to read the stream
    finally:
        reader.cancel()
        while not pending.empty():
            left = pending.get_nowait()
            if left is not None:
                left.cancel()


async def _read(
    requests: AsyncIterable[T],
    handle: Callable[[T], Awaitable[bytes]],
    pending: asyncio.Queue[asyncio.Task[bytes] | None],
) -> None:
    try:
        async for request in requests:
            task = asyncio.ensure_future(handle(request))
            try:
                await pending.put(task)
            except BaseException:
                task.cancel()
                raise
    except asyncio.CancelledError:
        raise
    except BaseException:
        await pending.put(None)  # wake the writer, which re-raises this
        raise
    await pending.put(None)
