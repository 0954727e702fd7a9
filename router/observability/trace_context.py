"""W3C trace context (``traceparent``): the caller's trace a request's spans join."""

from __future__ import annotations

import re

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def parse_traceparent(header: str) -> tuple[bytes, bytes] | None:
    """(trace id, parent span id) of a valid ``traceparent``, else None (a new trace starts).

    Version ``ff`` and all-zero ids are invalid; a later version may append fields,
    which are ignored, as the W3C recommendation asks.
    """
    match = _TRACEPARENT.fullmatch(header.strip().lower())
    if match is None:
        return None
    version, trace_id, span_id, _flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or not int(trace_id, 16) or not int(span_id, 16):
        return None
    return bytes.fromhex(trace_id), bytes.fromhex(span_id)
