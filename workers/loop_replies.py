"""Direct responses sent from a backend's own event loop (vLLM's engine thread).

A decoupled model that runs on an asyncio loop of its own would otherwise hand
every response to the worker's main loop: a queue, a wake-up write, and the main
thread waiting for the GIL the engine thread holds, per token. ``LoopReplies``
sends them from the loop's thread instead, on sockets of its own to the ingress
PULL endpoints, and coalesces what one loop turn produced into one message per
ingress: an engine step's tokens for all its requests leave together, flushed on
the next turn, so no token waits for a later one. The router's notes
(``ItemResponsesSent``) still go through the main loop; they are off the
latency path.

Only the loop's thread may call ``send`` and ``close`` (ZeroMQ sockets are not
thread-safe).
"""

from __future__ import annotations

import asyncio

import zmq

from conveyor.workers.reply_links import ReplyLinks


class LoopReplies:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._links = ReplyLinks(zmq.Context.instance())  # the worker's context: no second I/O thread
        self._flush_due = False
        self._closed = False

    def send(self, endpoint: str, payload: bytes) -> None:
        if self._closed:  # the model is closing: its requests were failed by the worker already
            return
        self._links.send(endpoint, payload)
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        self._links.flush()

    def close(self) -> None:
        self._closed = True
        self._links.flush()
        self._links.close()
