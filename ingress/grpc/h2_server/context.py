"""The per-call context handed to the servicers: the part of
``grpc.aio.ServicerContext`` they use."""

from __future__ import annotations

import asyncio
from typing import Any, NoReturn

import grpc
from grpc.aio import AbortError

from conveyor.ingress.grpc.h2_server.metadata import RequestHead


class CallContext:
    __slots__ = ("_head", "_loop", "code", "deadline", "details")

    def __init__(self, head: RequestHead, loop: asyncio.AbstractEventLoop) -> None:
        self._head = head
        self._loop = loop
        timeout = head.timeout_s
        self.deadline = None if timeout is None else loop.time() + timeout  # the client's, on the loop's clock
        self.code: grpc.StatusCode | None = None  # set by abort() or set_code()
        self.details = ""

    def time_remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - self._loop.time())

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._head.metadata()

    def method(self) -> str:
        return self._head.path

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        self.code, self.details = code, details
        raise AbortError()

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details
