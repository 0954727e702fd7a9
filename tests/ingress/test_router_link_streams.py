"""A streamed request's responses on the ingress's router link (``ingress/router_link.py``): read one by
one (``infer_stream``) or every waiting one at once (``infer_stream_batches``), in order, and those
a reader leaves unread handed to ``on_orphan`` (their shared memory is freed there)."""

from __future__ import annotations

import asyncio
import contextlib

from conveyor.ingress.router_link import RouterLink
from conveyor.proto import messages as m

LEVEL = "unit"


def _link() -> tuple[RouterLink, list[int]]:
    orphans: list[int] = []
    link = RouterLink("tcp://127.0.0.1:1", on_orphan=lambda r: orphans.append(len(r.outputs)))  # never connects
    return link, orphans


def _response(rid: int, number: int, final: bool = False) -> m.InferResponse:
    # ``outputs`` stands for the response's number here, to see which ones went where.
    ref = m.TensorRef("text_output", "BYTES", [1], "r", 0, 0)
    return m.InferResponse(rid, "llm", "1", [ref] * number, final=final)


def test_a_reader_takes_every_response_waiting_in_order() -> None:
    link, orphans = _link()

    async def run() -> list[list[int]]:
        request = m.InferRequest(7, "llm", "", [], [])
        found: list[list[int]] = []
        async with contextlib.aclosing(link.infer_stream_batches(request)) as batches:
            reader = asyncio.ensure_future(anext(batches))
            await asyncio.sleep(0)  # the request is sent, the reader waits
            link._on_reply(_response(7, 1))
            found.append([len(r.outputs) for r in await reader])
            for number in (2, 3, 4):  # arrive while the reader is busy elsewhere
                link._on_reply(_response(7, number))
            found.append([len(r.outputs) for r in await anext(batches)])
            link._on_reply(_response(7, 5, final=True))
            found.append([len(r.outputs) for r in await anext(batches)])
        return found

    try:
        assert asyncio.run(run()) == [[1], [2, 3, 4], [5]]
        assert orphans == []
    finally:
        asyncio.run(link.close())


def test_what_a_reader_leaves_unread_is_orphaned() -> None:
    link, orphans = _link()

    async def run() -> list[int]:
        request = m.InferRequest(8, "llm", "", [], [])
        responses = link.infer_stream(request)
        reader = asyncio.ensure_future(anext(responses))
        await asyncio.sleep(0)
        for number in (1, 2, 3):
            link._on_reply(_response(8, number))
        first = len((await reader).outputs)
        await responses.aclose()  # 2 and 3 were taken from the link but not read
        link._on_reply(_response(8, 4, final=True))  # after the reader left
        return [first]

    try:
        assert asyncio.run(run()) == [1]
        assert orphans == [2, 3, 4]
    finally:
        asyncio.run(link.close())
