"""The waiting side of a BLS call: where the worker's main thread puts the
call's responses, and what wakes the call when the requests it was made for
are cancelled.

Once a call is abandoned (cancelled, or its awaiting task was), the responses
already queued and those still to come are released unread, with no window
in which one could be queued and forgotten: the callee's output block goes
back at once instead of after the arena's 120 s reclaim.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Sequence

from conveyor.proto import messages as m
from conveyor.workers.backends.base import ResponseChannel
from conveyor.workers.backends.python.pb_utils import bls

Release = Callable[[m.InferResponse], None]
# Put in a call's answers when the requests it was made for are all cancelled.
CANCELLED = m.InferResponse(0, "", "", final=False)


class CancelWatch:
    """Calls ``on_cancel`` once every one of ``channels`` is cancelled (from the
    worker's main thread, or at once if they already are); never without channels."""

    def __init__(self, channels: Sequence[ResponseChannel], on_cancel: Callable[[], None]) -> None:
        self._channels = channels
        self._on_cancel = on_cancel
        self._fired = False
        for channel in channels:
            channel.add_cancel_hook(self._check)
        self._check()

    @classmethod
    def for_caller(cls, on_cancel: Callable[[], None]) -> CancelWatch | None:
        """A watch over the requests the calling thread's ``execute`` serves, if any."""
        requests = bls.current_requests()
        if not requests:
            return None
        channels = [r._channel for r in requests if r._channel is not None]
        return cls(channels, on_cancel) if channels else None

    @property
    def fired(self) -> bool:
        return self._fired

    def _check(self) -> None:
        if not self._fired and all(c.cancelled for c in self._channels):
            self._fired = True
            self._on_cancel()

    def close(self) -> None:
        for channel in self._channels:
            channel.remove_cancel_hook(self._check)


class Answers:
    """A blocking call's responses (``put`` from any thread, ``get`` from the caller)."""

    def __init__(self, release: Release) -> None:
        self._queue: queue.SimpleQueue[m.InferResponse] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._abandoned = False
        self._release = release

    def put(self, msg: m.InferResponse) -> None:
        with self._lock:
            if not self._abandoned:
                self._queue.put(msg)
                return
        self._release(msg)

    def get(self) -> m.InferResponse:
        return self._queue.get()

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            while True:
                try:
                    self._release(self._queue.get_nowait())
                except queue.Empty:
                    return


class AsyncAnswers:
    """An ``async_exec`` call's responses: ``put`` from any thread hands them to the
    event loop's thread, where they are queued (or released once abandoned)."""

    def __init__(self, release: Release) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[m.InferResponse] = asyncio.Queue()
        self._abandoned = False
        self._release = release

    def put(self, msg: m.InferResponse) -> None:
        self._loop.call_soon_threadsafe(self._arrive, msg)

    def _arrive(self, msg: m.InferResponse) -> None:
        if self._abandoned:
            self._release(msg)
        else:
            self._queue.put_nowait(msg)

    async def get(self) -> m.InferResponse:
        return await self._queue.get()

    def abandon(self) -> None:
        """On the event loop's thread."""
        self._abandoned = True
        while not self._queue.empty():
            self._release(self._queue.get_nowait())
