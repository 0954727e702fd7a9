"""The HTTP ingress's protocol (uvicorn with ``HttpToolsProtocol``, uvloop) serving an ASGI app from a thread of the
test process, on a free loopback port: the protocol's own behaviour, without a group."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from conveyor.ingress.http.protocol import HttpToolsProtocol
from conveyor.ingress.http.server import bind_socket

START_S = 30.0  # a bound, never a measure


def serve(app: Any, **config: Any) -> Iterator[int]:
    """A fixture's body (``yield from serve(app, ...)``): ``app`` served with uvicorn's ``config`` on top of the
    ingress's own; the port, then the server stopped."""
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, http=HttpToolsProtocol, loop="uvloop",
                                           lifespan="off", ws="none", log_config=None, access_log=False, **config))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + START_S
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(START_S)
