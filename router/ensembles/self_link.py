"""The router's own client socket, for the requests it makes itself (ensemble steps).

A step is enqueued by calling the router directly, under this socket's identity;
every reply path of the router sends to an identity on its ROUTER socket, so the
step's response arrives here like any ingress's would, and the router's hot path
needs no branch for it. The DEALER is connected over inproc and never refuses a
message (no high-water mark): a reply the ROUTER dropped would hang an ensemble.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import zmq

from conveyor.proto import messages as m
from conveyor.proto.framing import drain

SELF_IDENTITY = b"\x00conveyor-router-self"


class SelfLink:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], front: zmq.Socket[bytes]) -> None:
        endpoint = f"inproc://conveyor-router-self-{id(front):x}"
        front.bind(endpoint)
        self.identity = SELF_IDENTITY
        self.sock = ctx.socket(zmq.DEALER)
        for option, value in ((zmq.LINGER, 0), (zmq.SNDHWM, 0), (zmq.RCVHWM, 0)):
            self.sock.setsockopt(option, value)
        self.sock.setsockopt(zmq.ROUTING_ID, SELF_IDENTITY)
        self.sock.connect(endpoint)
        # Announce ourselves, so the ROUTER knows the route before the first reply.
        self.sock.send(m.encode(m.IngressHello(m.PROTOCOL_VERSION, os.getpid())))

    def drain(self, handle: Callable[[m.InferResponse], None]) -> bool:
        """Hand every step response waiting to ``handle``; True if more may wait."""

        def on_reply(msg: m.RouterToIngress) -> None:
            if isinstance(msg, m.InferResponse):
                handle(msg)

        return drain(self.sock, m.router_reply_decoder.decode, on_reply, "the router's own link")

    def close(self) -> None:
        self.sock.close(0)
