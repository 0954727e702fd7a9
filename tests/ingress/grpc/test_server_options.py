"""The keepalive flags reach the grpcio server of their own process, without changing the
options every other server in the process is built with."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conveyor.ingress.grpc import server as grpc_server

LEVEL = "unit"


class _Built(Exception):
    pass


def test_start_server_adds_its_options_to_the_shared_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[tuple[str, Any]]] = []

    def fake_server(*, options: list[tuple[str, Any]], interceptors: list[Any]) -> Any:
        seen.append(list(options))
        raise _Built

    monkeypatch.setattr(grpc_server.grpc.aio, "server", fake_server)
    keepalive = [("grpc.keepalive_time_ms", 10000)]
    for _ in range(2):
        with pytest.raises(_Built):
            asyncio.run(grpc_server.start_server(object(), "127.0.0.1", 0,  # type: ignore[arg-type]
                                                 implementation="grpcio", options=keepalive))
    assert seen[0] == [*grpc_server.SERVER_OPTIONS, *keepalive] == seen[1]  # not added twice
    assert ("grpc.keepalive_time_ms", 10000) not in grpc_server.SERVER_OPTIONS
