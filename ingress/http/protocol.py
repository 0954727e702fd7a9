"""The HTTP ingress's connection protocols: uvicorn's httptools protocol, adjusted.

``HttpToolsProtocol`` serves every connection (``fast_protocol.py`` builds on it);
``CaseKeepingProtocol`` only when headers are forwarded to models.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as UvicornHttpToolsProtocol

from conveyor.ingress.header_forward import RAW_HEADERS
from conveyor.ingress.http.corked_transport import CorkedTransport


class HttpToolsProtocol(UvicornHttpToolsProtocol):
    """uvicorn's httptools protocol that, as Triton (libevhtp), reads a request carrying
    both ``Content-Length`` and ``Transfer-Encoding: chunked`` by its chunks (RFC 9112
    6.3) instead of refusing it; ``BodyLimit`` closes such a connection after the answer.
    A response's head and body leave in one write (``CorkedTransport``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parser.set_dangerous_leniencies(lenient_chunked_length=True)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = CorkedTransport(transport, self.loop)  # type: ignore[assignment]


class CaseKeepingProtocol(HttpToolsProtocol):
    """Also keeps each header as the client wrote its name, under ``RAW_HEADERS`` in the
    ASGI scope: Triton hands forwarded headers (``--http-header-forward-pattern``) to the
    model with their names' case, which ASGI's lower-cased ``headers`` have lost. Only
    used when forwarding is on."""

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self.scope.setdefault(RAW_HEADERS, []).append((name.decode("latin-1"), value))  # type: ignore[misc]
