"""Running one call: the servicer's method on its request(s), its answer out; or, for a unary
method with a direct entry (``H2Server.direct``), answered from a callback without a task."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import grpc
from grpc.aio import AbortError

from conveyor.ingress.grpc.h2_server.outbound import Outbound
from conveyor.ingress.grpc.h2_server.stream import Running, Stream

log = logging.getLogger(__name__)

_OK, _UNKNOWN, _DEADLINE_EXCEEDED = 0, 2, 4


# A unary method served without a task: it takes the deserialized request and either answers
# through ``out`` (now or from a callback) and returns what waits for the answer, or returns None
# when the call must run as a task (``run_call`` with the same request, already deserialized).
Direct = Callable[[Any, Stream, Outbound], Running | None]


def _code(status: grpc.StatusCode | None, default: int) -> int:
    return int(status.value[0]) if status is not None else default


async def run_call(out: Outbound, stream: Stream, request: Any, parsed: bool = False) -> None:
    """``request`` is the unary message (bytes-like; ``parsed``: deserialized already) or the
    ``Inbox`` of a streaming one."""
    handler, ctx = stream.handler, stream.ctx
    serialize = handler.response_serializer
    try:
        if not parsed and not handler.request_streaming and handler.request_deserializer is not None:
            request = handler.request_deserializer(request)
        if not handler.response_streaming:
            method = handler.stream_unary if handler.request_streaming else handler.unary_unary
            response = await method(request, ctx)
            if ctx.code is not None and ctx.code is not grpc.StatusCode.OK:  # set_code() without abort()
                out.finish(stream, _code(ctx.code, _UNKNOWN), ctx.details)
                return
            out.reply(stream, serialize(response) if serialize is not None else response)
            return
        method = handler.stream_stream if handler.request_streaming else handler.unary_stream
        async for item in method(request, ctx):
            out.send_message(stream, serialize(item) if serialize is not None else item)
            if out.must_wait(stream):
                await out.drained(stream)
        out.finish(stream, _code(ctx.code, _OK), ctx.details)
    except AbortError:
        out.finish(stream, _code(ctx.code, _UNKNOWN), ctx.details)
    except asyncio.CancelledError:
        if stream.expired:
            out.finish(stream, _DEADLINE_EXCEEDED, "Deadline Exceeded")
    except Exception as err:
        log.exception("gRPC call %s failed", stream.head.path)
        out.finish(stream, _UNKNOWN, f"Unexpected {type(err)}: {err}")
