"""``stream_replies``: in-order replies keep request order, a decoupled
request's replies go out as they come, interleaved with the others."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from conveyor.ingress.grpc.stream import Replies, stream_replies

LEVEL = "unit"

async def test_in_order_replies_wait_for_earlier_ones_and_streamed_ones_do_not() -> None:
    release_first = asyncio.Event()

    async def requests() -> AsyncIterator[str]:
        for name in ("slow", "streamed", "quick"):
            yield name

    async def handle(name: str, replies: Replies) -> None:
        if name == "slow":
            await release_first.wait()
            await replies.send_in_order(b"slow")
        elif name == "streamed":
            await replies.send(b"part-1")
            await replies.send(b"part-2")
        else:
            await replies.send_in_order(b"quick")

    seen: list[bytes] = []
    async for reply in stream_replies(requests(), handle):
        seen.append(reply)
        if len(seen) == 2:
            release_first.set()  # "quick" is ready but must wait for "slow"
    assert seen == [b"part-1", b"part-2", b"slow", b"quick"]


async def test_a_failed_request_does_not_hold_later_replies() -> None:
    async def requests() -> AsyncIterator[int]:
        for i in range(3):
            yield i

    async def handle(i: int, replies: Replies) -> None:
        if i == 0:
            raise RuntimeError("lost")
        await replies.send_in_order(str(i).encode())

    seen = [reply async for reply in stream_replies(requests(), handle)]
    assert seen == [b"1", b"2"]


async def test_requests_are_sent_in_stream_order_even_when_an_earlier_one_waits_longer() -> None:
    """A sequence's START that waits (e.g. for the model's signature) is not overtaken by the
    request after it: each request's send waits for the turn of the one before."""
    release = asyncio.Event()
    sent: list[int] = []

    async def requests() -> AsyncIterator[int]:
        for i in range(4):
            yield i

    async def handle(i: int, replies: Replies) -> None:
        if i == 0:
            await release.wait()  # the first is held up before it can be sent
        if i == 1:
            raise RuntimeError("refused before it was sent")  # must not hold the later ones back
        await replies.send_turn.wait()
        sent.append(i)
        replies.send_turn.done()
        await replies.send_in_order(str(i).encode())

    async def unblock() -> None:
        await asyncio.sleep(0.05)
        assert sent == []  # 2 and 3 were ready long ago, but wait for 0
        release.set()

    waker = asyncio.create_task(unblock())
    seen = [reply async for reply in stream_replies(requests(), handle)]
    await waker
    assert sent == [0, 2, 3]
    assert seen == [b"0", b"2", b"3"]
