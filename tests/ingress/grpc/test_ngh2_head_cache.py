"""The ngh2 engine's cache of parsed request heads (limits.HEAD_CACHE_ENTRIES, HEAD_CACHE_BYTES): a client that
sends ever new header lists gets each call's own metadata, and the connection keeps no more than the bound; one
whose lists repeat has them parsed once."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import hpack
from hyperframe.frame import DataFrame, HeadersFrame

from conveyor.ingress.grpc.h2_server.connection import GrpcConnection
from conveyor.ingress.grpc.h2_server.limits import HEAD_CACHE_BYTES, HEAD_CACHE_ENTRIES
from conveyor.ingress.grpc.h2_server.ngh2_engine import Ngh2Engine
from conveyor.ingress.grpc.h2_server.server import H2Server
from tests.ingress.grpc.test_h2_engines_differential import START, Transport, message, wire

LEVEL = "unit"

PATH = "/test.Service/Tag"


def tagging_server() -> H2Server:
    async def tag(request: bytes, context: Any) -> bytes:
        return dict(context.invocation_metadata())["x-tag"].encode()

    return H2Server({PATH: grpc.unary_unary_rpc_method_handler(tag)}, engine="ngh2")


async def answers(tags: list[str]) -> tuple[list[bytes], GrpcConnection]:
    """One call per tag (metadata ``x-tag``) on one connection, HPACK-encoded as a client does (one encoder, its
    dynamic table); the answers' messages in order."""
    conn = GrpcConnection(tagging_server())
    transport = Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(START)
    encoder = hpack.Encoder()
    for i, tag in enumerate(tags):
        sid = 2 * i + 1
        block = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", PATH), (":authority", "x"),
                                ("content-type", "application/grpc"), ("te", "trailers"), ("x-tag", tag)])
        conn.data_received(wire(HeadersFrame(sid, block, flags=["END_HEADERS"]),
                                DataFrame(sid, message(b""), flags=["END_STREAM"])))
        for _ in range(5):
            await asyncio.sleep(0)
    out = bytes(transport.out)
    got = []
    pos = 0
    while pos < len(out):  # the DATA frames' messages (the server's frames, each whole)
        length, kind = int.from_bytes(out[pos:pos + 3], "big"), out[pos + 3]
        if kind == 0x0:
            got.append(out[pos + 9 + 5:pos + 9 + length])
        pos += 9 + length
    conn.connection_lost(None)
    return got, conn


def heads(conn: GrpcConnection) -> dict[Any, Any]:
    engine = conn._engine
    assert isinstance(engine, Ngh2Engine)
    return engine._heads


async def test_ever_new_header_lists_each_get_their_own_metadata_and_the_cache_stays_bounded() -> None:
    tags = [f"call-{i}" for i in range(3 * HEAD_CACHE_ENTRIES)]
    got, conn = await answers(tags)
    assert got == [t.encode() for t in tags]
    assert 0 < len(heads(conn)) <= HEAD_CACHE_ENTRIES


async def test_a_repeated_header_list_is_parsed_once_and_a_large_one_never_kept() -> None:
    large = "L" * HEAD_CACHE_BYTES  # with the other headers, over HEAD_CACHE_BYTES (and under the call's limit)
    tags = ["same", "same", large, "same", large]
    got, conn = await answers(tags)
    assert got == [t.encode() for t in tags]
    kept = heads(conn)
    assert len(kept) == 1 and [v for k, v in next(iter(kept)) if k == b"x-tag"] == [b"same"]
