"""The ``conveyor-timeout-ms`` header read (``ingress/http/deadline.py``): a whole number of
milliseconds, anything else a client's INVALID_ARG, never an internal error; and the cut."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.ingress.http.deadline import MAX_TIMEOUT_MS, parse_timeout, within
from conveyor.proto.errors import ConveyorError, Status

LEVEL = "unit"


def test_the_header_is_milliseconds() -> None:
    assert parse_timeout(None) is None
    assert parse_timeout("2500") == 2.5
    assert parse_timeout(" 10 ") == 0.01
    assert parse_timeout(str(MAX_TIMEOUT_MS)) == MAX_TIMEOUT_MS / 1000


@pytest.mark.parametrize("value", ["", "0", "-1", "1.5", "1e3", "²", "٣", "9" * 5000, str(MAX_TIMEOUT_MS + 1)])
def test_anything_else_is_invalid_arg(value: str) -> None:
    with pytest.raises(ConveyorError) as refused:
        parse_timeout(value)
    assert refused.value.status is Status.INVALID_ARG and "conveyor-timeout-ms" in refused.value.message


def test_work_past_the_deadline_is_cancelled_and_answered_deadline_exceeded() -> None:
    cancelled = []

    async def slow() -> int:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return 1

    async def run() -> None:
        assert await within(None, asyncio.sleep(0, 7)) == 7
        assert await within(1.0, asyncio.sleep(0, 8)) == 8
        with pytest.raises(ConveyorError) as late:
            await within(0.01, slow())
        assert late.value.status is Status.DEADLINE_EXCEEDED

    asyncio.run(run())
    assert cancelled == [True]
