"""One read of many tiny frames on the ngh2 engine is handled in pieces of about NGH2_FEED_FRAMES events
(limits.py), the rest on later loop turns: other connections are not held up behind it."""

from __future__ import annotations

import asyncio
from typing import Any

from hyperframe.frame import WindowUpdateFrame

from conveyor.ingress.grpc.h2_server.connection import GrpcConnection
from conveyor.ingress.grpc.h2_server.limits import NGH2_FEED_FRAMES
from tests.ingress.grpc.test_h2_engines_differential import START, Transport, server, wire

LEVEL = "unit"

FRAMES = 20_000  # 260 KB of WINDOW_UPDATEs in one read


async def test_a_read_of_tiny_frames_is_handled_in_pieces() -> None:
    seen: list[tuple[Any, ...]] = []
    conn = GrpcConnection(server(seen, "ngh2"))
    transport = Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(START)
    engine = conn._engine
    pieces: list[int] = []
    feed = engine.feed

    def counted(data: bytes | memoryview) -> int:
        pieces.append(feed(data))
        return pieces[-1]

    engine.feed = counted  # type: ignore[method-assign]
    conn.data_received(wire(*[WindowUpdateFrame(0, window_increment=1)] * FRAMES))
    assert len(pieces) == 1  # the first piece now, the rest later
    for _ in range(FRAMES):
        if sum(pieces) >= FRAMES:
            break
        await asyncio.sleep(0)
    assert sum(pieces) == FRAMES and not transport.closed
    assert max(pieces[1:]) <= 2 * NGH2_FEED_FRAMES  # sized by what the pieces before held
    conn.connection_lost(None)
