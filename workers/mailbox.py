"""What the worker's other threads (instance threads, threads a model starts) hand its
main loop, which owns every socket: descriptors to send, in a queue, and a wake-up
down a pipe, so no thread needs a socket of its own (none to leak).
"""

from __future__ import annotations

import queue

from conveyor.deploy.runtime.wake_pipe import WakePipe
from conveyor.proto.framing import Outbox
from conveyor.workers.reply_links import ReplyLinks


class Mailbox:
    def __init__(self) -> None:
        self.pipe = WakePipe()  # the loop polls ``pipe.fd``; the worker's signals write to it too
        self._woken = False
        # (destination, descriptor); "" is the router, else an ingress endpoint.
        self.results: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()

    def post(self, payload: bytes) -> None:
        """Send ``payload`` to the router from any thread."""
        self.results.put(("", payload))
        self.wake()

    def post_all(self, messages: list[tuple[str, bytes]]) -> None:
        """Send each (destination, payload) from any thread ("" = the router), with one wake-up."""
        put = self.results.put
        for message in messages:
            put(message)
        self.wake()

    def wake(self) -> None:
        # One write until the loop has woken: a decoupled model posts a response per token from its
        # own thread. The loop clears ``_woken`` after emptying the pipe and before taking what was
        # posted. (Deferring the write to the end of the poster's event-loop turn was tried: vLLM's
        # first token then waited for the rest, 41 ms against 11 ms at one client.)
        if self._woken:
            return
        self._woken = True
        self.pipe.wake()

    def woken(self) -> None:
        """The main loop saw the pipe readable: empty it, so the next post writes again."""
        self.pipe.clear()
        self._woken = False

    def take(self, router: Outbox, replies: ReplyLinks) -> None:
        """Move what other threads posted into this turn's outboxes."""
        if self.results.empty():  # the usual turn: no exception raised to learn it
            return
        get = self.results.get_nowait
        while True:
            try:
                dest, payload = get()
            except queue.Empty:
                return
            if dest:
                replies.send(dest, payload)
            else:
                router.send(payload)

    def close(self) -> None:
        self.pipe.close()
