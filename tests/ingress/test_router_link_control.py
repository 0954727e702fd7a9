"""A control call on the ingress's router link (``ingress/router_link.py``) whose arguments cannot
travel: a client's JSON may hold an integer of any size, MessagePack carries 64 bits. The call is
refused as the client's mistake (INVALID_ARG, HTTP 400), not an internal error, and nothing waits."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.ingress.router_link import RouterLink
from conveyor.proto.errors import ConveyorError, Status

LEVEL = "unit"


@pytest.mark.parametrize("number", [2**64, -(2**63) - 1, 10**30])
def test_an_integer_past_64_bits_is_the_clients_mistake(number: int) -> None:
    link = RouterLink("tcp://127.0.0.1:1")  # never connects: the call must not reach the socket

    async def run() -> None:
        with pytest.raises(ConveyorError) as err:
            await link.trace_settings("", {"trace_rate": number})
        assert err.value.status is Status.INVALID_ARG
        assert "64-bit" in str(err.value)
        assert not link._calls._controls  # nothing left waiting for an answer

    try:
        asyncio.run(run())
    finally:
        asyncio.run(link.close())
