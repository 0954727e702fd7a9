"""``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern``: request
headers (HTTP) or metadata (gRPC) whose name matches become string parameters of the
request, so a model reads them with ``request.parameters()``, as in Triton.

Triton's rules, kept here: the pattern is a partial match (RE2 ``PartialMatch``:
``re.search``), case-insensitive unless it starts with ``(?-i)``; a matching name that
is a reserved parameter key or starts with ``triton_`` fails the request. An HTTP
header's name reaches the model as the client wrote it (``X-Trace-Id``), as libevhtp
keeps it for Triton (the HTTP server keeps the names under ``RAW_HEADERS`` in the ASGI
scope when forwarding is on); gRPC metadata names are lower-case by the protocol.

Compiled once at start; with no pattern the ingress holds ``None`` and does no work.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from conveyor.proto.errors import invalid_arg

# Triton's kReservedParameterKeys (src/common.h): never taken from a header.
RESERVED_KEYS = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output")
)
_CASE_SENSITIVE = "(?-i)"
RAW_HEADERS = "conveyor.raw_headers"  # ASGI scope key: [(name as sent, value)]


class HeaderForward:
    """One compiled ``--*-header-forward-pattern``."""

    __slots__ = ("_regex", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        # Triton prefixes "(?i)" to the flag's value; RE2 then lets "(?-i)" turn it off
        # again. Python's re has no global "(?-i)", so the prefix picks the flags here.
        if pattern.startswith(_CASE_SENSITIVE):
            self._regex = re.compile(pattern[len(_CASE_SENSITIVE):])
        else:
            self._regex = re.compile(pattern, re.IGNORECASE)

    def apply(self, headers: Iterable[tuple[str, Any]], parameters: dict[str, Any]) -> None:
        """Add each matching header to ``parameters`` as a string (a header wins over a
        body parameter of the same name, as the last one set does in Triton)."""
        search = self._regex.search
        for key, value in headers:
            if not search(key):
                continue
            if key in RESERVED_KEYS or key.startswith("triton_"):
                raise invalid_arg(f"Header '{key}' is reserved for Triton usage and cannot be forwarded.")
            parameters[key] = value if isinstance(value, str) else bytes(value).decode("utf-8", "replace")


def header_forward(pattern: str | None) -> HeaderForward | None:
    """The compiled pattern, ``None`` when the flag is absent or empty (Triton: no forwarding)."""
    return HeaderForward(pattern) if pattern else None


def check_pattern(flag: str, pattern: str | None) -> str:
    """Why ``pattern`` cannot be used, or '' (the command line refuses it at start)."""
    try:
        header_forward(pattern)
    except re.error as err:
        return f"{flag}: invalid regular expression '{pattern}': {err}"
    return ""
