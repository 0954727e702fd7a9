"""The ingress's router link waits on its sockets' ``ZMQ_FD``, which is edge-triggered: a send or a
receive may take in the socket's pending commands and consume the notification of a message. These
tests drive a real ``RouterLink`` against a real ROUTER socket (the router's side) and a real PUSH
socket (a worker answering directly), and check that no message is left behind such a consumed
notification: the link must take it without any further traffic."""

from __future__ import annotations

import asyncio
import select
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from conveyor.ingress.router_link import RouterLink
from conveyor.proto import messages as m

LEVEL = "unit"

# Bound for a blocking wait on a real socket in these tests (a hang fails instead of blocking the suite).
WAIT_MS = 10_000
# Longer than libzmq's throttle on the command processing a send does (3M TSC ticks, about 1 ms): the
# next send then takes in the socket's pending commands, which is the case under test.
PAST_SEND_THROTTLE_S = 0.02


async def _turns(n: int = 5) -> None:
    """Let the event loop run ``n`` turns (no clock involved)."""
    for _ in range(n):
        await asyncio.sleep(0)


def _hello(router: zmq.Socket[bytes]) -> bytes:
    """The link's identity, from its hello."""
    assert router.poll(WAIT_MS), "no hello from the link"
    identity, *frames = router.recv_multipart()
    assert any(isinstance(m.ingress_decoder.decode(f), m.IngressHello) for f in frames)
    return identity


def test_a_reply_announced_before_a_send_is_taken_after_it(tmp_path: Path) -> None:
    """The router's message arrives (its announcement waits on the link's descriptor), then the link
    sends: the send takes in the announcement. The link must still take the message, with no other
    wake-up to come."""
    endpoint = f"ipc://{tmp_path}/router.sock"
    router: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    link = RouterLink(endpoint)

    async def run() -> None:
        await link.start()
        await _turns()
        identity = _hello(router)
        assert not link.tracing
        router.send_multipart([identity, m.encode(m.SettingsUpdate({}, True))])
        # The announcement is on the link's descriptor now (nothing has taken it: the loop is held here).
        ready, _, _ = select.select([link._sock.FD], [], [], WAIT_MS / 1000)
        assert ready
        time.sleep(PAST_SEND_THROTTLE_S)
        link.refused("m", "1")
        link._flush()  # the end of this turn's sends, before the loop looks at any descriptor
        ready, _, _ = select.select([link._sock.FD], [], [], 0)
        assert not ready, "the send did not take in the announcement: the case is not exercised"
        await _turns()
        assert link.tracing  # the message was taken

    try:
        asyncio.run(run())
    finally:
        asyncio.run(link.close())
        router.close(0)


def test_a_direct_reply_after_a_drain_is_taken(tmp_path: Path) -> None:
    """A worker's replies straight to the link: each that arrives after the link drained its socket
    (the socket answered "nothing") is taken, one after another and in a burst."""
    endpoint = f"ipc://{tmp_path}/router.sock"
    router: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    link = RouterLink(endpoint)
    assert link.reply_to
    worker: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUSH)
    worker.setsockopt(zmq.LINGER, 0)
    worker.connect(link.reply_to)
    got: list[int] = []

    def _answered(fut: asyncio.Future[None]) -> Callable[[m.InferResponse], None]:
        def answered(response: m.InferResponse) -> None:
            got.append(response.id)
            fut.set_result(None)
        return answered

    async def run() -> None:
        await link.start()
        loop = asyncio.get_running_loop()
        rounds = [1, 1, 1, 5]  # replies sent together
        rid = 100
        for burst in rounds:
            waiting = []
            for _ in range(burst):
                rid += 1
                fut: asyncio.Future[None] = loop.create_future()
                link._calls.add(rid, _answered(fut))
                waiting.append(fut)
            for i in range(burst):
                resp = m.InferResponse(rid - burst + 1 + i, "simple", "1")
                worker.send(m.encode(resp))
            await asyncio.wait_for(asyncio.gather(*waiting), WAIT_MS / 1000)

    try:
        asyncio.run(run())
    finally:
        asyncio.run(link.close())
        worker.close(0)
        router.close(0)
    assert got == list(range(101, 109))
