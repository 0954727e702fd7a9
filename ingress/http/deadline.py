"""A KServe HTTP client's deadline, the header's counterpart of gRPC's: ``conveyor-timeout-ms: 2500``.

The time is counted from when the ingress has read the request. As with a gRPC deadline it is a
hard one: a request still queued in the router when it passes ends there with DEADLINE_EXCEEDED,
never runs and frees its place under the model's MAX_WAITING_REQUESTS (router/scheduling/overload.py);
one the model is running past it is cancelled (the model sees ``is_cancelled()``) and answered
DEADLINE_EXCEEDED by the ingress at once (HTTP 400, Triton's mapping for that status). A client
that sets none waits as before. Triton's ``timeout`` request parameter keeps its own meaning: the
model's queue policy's business (docs/SCHEDULING.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from conveyor.proto.errors import ConveyorError, Status, invalid_arg

TIMEOUT_HEADER = "conveyor-timeout-ms"
TIMEOUT_HEADER_BYTES = TIMEOUT_HEADER.encode()  # as uvicorn hands the fast path its (lower-cased) names
# The longest deadline taken (a day): a bigger number is more likely a unit mistake than a wish.
MAX_TIMEOUT_MS = 86_400_000
_DIGITS = len(str(MAX_TIMEOUT_MS))  # longer is refused before int() (which refuses 4300 digits itself, as a 500)
# The ingress's own cut comes this much after the deadline, so that a request still queued is answered
# by the router (which counts it as Triton counts an expired request) rather than cancelled here.
ROUTER_FIRST_S = 0.05

T = TypeVar("T")


def parse_timeout(value: str | None) -> float | None:
    """The header's deadline in seconds; None when it is absent. A value that is no whole number of
    milliseconds from 1 to MAX_TIMEOUT_MS is INVALID_ARG."""
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= _DIGITS) or not 0 < int(text) <= MAX_TIMEOUT_MS:
        raise invalid_arg(f"header '{TIMEOUT_HEADER}' must be a whole number of milliseconds from 1 to "
                          f"{MAX_TIMEOUT_MS}, not '{value}'")
    return int(text) / 1000


async def within(timeout_s: float | None, work: Awaitable[T]) -> T:
    """``work``'s result, or DEADLINE_EXCEEDED once ``timeout_s`` (and the router's turn) is over;
    cancelling ``work`` cancels its request (``RouterLink.infer``)."""
    if timeout_s is None:
        return await work
    try:
        async with asyncio.timeout(timeout_s + ROUTER_FIRST_S):
            return await work
    except TimeoutError:
        raise ConveyorError(Status.DEADLINE_EXCEEDED, "Deadline Exceeded") from None  # gRPC's words
