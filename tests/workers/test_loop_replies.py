"""``LoopReplies``: responses sent from a backend's own event loop, one message per ingress per turn."""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq

from conveyor.workers.loop_replies import LoopReplies

LEVEL = "unit"


def pull(endpoint: str) -> zmq.Socket[bytes]:
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    return sock


def test_one_turns_responses_leave_as_one_message_per_ingress(tmp_path: Path) -> None:
    a, b = f"ipc://{tmp_path}/a.sock", f"ipc://{tmp_path}/b.sock"
    ingress_a, ingress_b = pull(a), pull(b)
    loop = asyncio.new_event_loop()
    try:
        replies = LoopReplies(loop)

        async def engine_step() -> None:  # one step's tokens for three requests, from two ingresses
            replies.send(a, b"token 1")
            replies.send(b, b"token 2")
            replies.send(a, b"token 3")
            await asyncio.sleep(0.05)  # the next turns: flushed already, nothing more
            replies.send(a, b"token 4")
            await asyncio.sleep(0)

        loop.run_until_complete(engine_step())
        assert ingress_a.poll(5_000) and ingress_a.recv_multipart() == [b"token 1", b"token 3"]
        assert ingress_b.poll(5_000) and ingress_b.recv_multipart() == [b"token 2"]
        assert ingress_a.poll(5_000) and ingress_a.recv_multipart() == [b"token 4"]
        loop.run_until_complete(asyncio.sleep(0))
        replies.close()
        replies.send(a, b"after close")  # a closing model's late response: dropped, no new socket
        loop.run_until_complete(asyncio.sleep(0.01))
        assert not ingress_a.poll(100)
    finally:
        loop.close()
        ingress_a.close(0)
        ingress_b.close(0)
