"""Where workers may answer an ingress directly (``ingress/router_link.py`` ``reply_endpoint``)."""

from __future__ import annotations

import pytest

from conveyor.ingress.router_link import DIRECT_REPLIES_ENV, reply_endpoint

LEVEL = "unit"


def test_direct_replies_need_an_ipc_router_endpoint_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DIRECT_REPLIES_ENV, raising=False)
    assert reply_endpoint("ipc:///run/conveyor/g/router-ingress.sock").startswith("ipc:///run/conveyor/g/ingress-")
    assert reply_endpoint("tcp://10.0.0.1:5555") == ""  # another host: every reply through the router
    monkeypatch.setenv(DIRECT_REPLIES_ENV, "0")
    assert reply_endpoint("ipc:///run/conveyor/g/router-ingress.sock") == ""
