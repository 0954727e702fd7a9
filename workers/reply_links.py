"""A worker's sockets to the ingress processes it answers directly.

The router marks a request ``BatchItem.reply_to`` when nothing but counting is
left for it to do with the response; the worker then sends the
``InferResponse`` straight to that ingress's PULL socket, and the router learns
the outcome from the ``BatchResult`` off the latency path. One PUSH socket per
ingress endpoint, connected on first use, each with its own outbox so that a
loop turn's responses to one ingress leave as one message.
"""

from __future__ import annotations

import zmq

from conveyor.proto.framing import Outbox

# Ingress processes come and go (restarts, scaling): past this many endpoints the oldest socket is closed.
MAX_LINKS = 64
# Responses queued for an ingress that is not (or no longer) connected; past it they are dropped.
QUEUE_LIMIT = 10_000


class ReplyLinks:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        self._ctx = ctx
        self._links: dict[str, Outbox] = {}

    def send(self, endpoint: str, payload: bytes) -> None:
        outbox = self._links.get(endpoint)
        if outbox is None:
            outbox = self._open(endpoint)
        outbox.send(payload)

    def flush(self) -> None:
        for outbox in self._links.values():
            if len(outbox):
                outbox.flush()

    def _open(self, endpoint: str) -> Outbox:
        if len(self._links) >= MAX_LINKS:
            oldest = next(iter(self._links))
            self._links.pop(oldest).sock.close(0)
        sock = self._ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, QUEUE_LIMIT)
        sock.connect(endpoint)
        outbox = self._links[endpoint] = Outbox(sock)
        return outbox

    def close(self) -> None:
        for outbox in self._links.values():
            outbox.sock.close(0)
        self._links.clear()
