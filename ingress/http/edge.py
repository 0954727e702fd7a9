"""What one HTTP client may hold of an ingress process, and for how long.

uvicorn (httptools) bounds none of it: a head sent a byte at a time, a connection that
never sends, a header list without end, a body declared longer than what comes, or a
client that never reads its answers each hold a connection (and some of them memory)
for as long as the client likes. ``protocol.py`` enforces these limits on every
connection of every HTTP-based ingress (KServe, metrics, SageMaker, Vertex AI, OpenAI);
docs/SECURITY.md lists them with what the client sees. ``0`` turns a setting off.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# Open client connections per ingress process (--http-max-connections). An idle one costs
# about 7 KiB, one mid-head up to MAX_HEAD_BYTES more: 4096 bound the worst to a few hundred
# MiB, and match the in-flight limit (one HTTP/1.1 request per connection at a time). Past
# it the connection waiting longest for a request is closed for the new one; with none
# waiting, the new one gets 503.
MAX_CONNECTIONS = 4096
# A request head must arrive within this (--http-header-timeout-secs), counted from the
# connection (first request) or the head's first byte (later ones): a head trickled a byte
# at a time (slowloris), or a connection that never sends, is closed with 408. Apache's
# mod_reqtimeout allows 20-40 s, nginx 60 s.
HEADER_TIMEOUT_S = 30.0
# The longest silence while a request body is still due (--http-body-timeout-secs): a
# Content-Length that never arrives is closed with 408 (nginx's client_body_timeout).
BODY_TIMEOUT_S = 60.0
# How long a client may leave its answer unread once the connection's send buffer is full
# (--http-write-timeout-secs): no more of its requests are read meanwhile, then it is
# dropped, freeing what was queued for it (nginx's send_timeout).
WRITE_TIMEOUT_S = 60.0
# The request line and headers together: a 431 past it. Node.js allows 16 KiB, nginx 32 KiB
# (4 x 8k buffers); room for long tokens and forwarded headers, yet bounded per connection.
MAX_HEAD_BYTES = 32 << 10
# Header fields per request: a 431 past it (Apache's LimitRequestFields). Each costs a
# Python tuple: thousands of tiny ones would cost far more memory than their bytes.
MAX_HEADERS = 100
# An idle keep-alive connection is closed after this (uvicorn's timeout_keep_alive):
# longer than the common 60 s idle timeout of load balancers, so they close first.
KEEP_ALIVE_S = 75
# Open files kept free for what is not a client connection (sockets to the router and
# workers, model files, logs) when raising the process's limit to fit the cap.
FD_RESERVE = 1024


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    max_connections: int = MAX_CONNECTIONS
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    write_timeout_s: float = WRITE_TIMEOUT_S
    max_head_bytes: int = MAX_HEAD_BYTES
    max_headers: int = MAX_HEADERS


@dataclass(eq=False)
class EdgeState:
    """One process's limits, and its connections waiting for a request (no request read or
    running on them), longest-waiting first: the ones closed for a newcomer at the cap."""

    limits: EdgeLimits = field(default_factory=EdgeLimits)
    waiting: dict[Any, None] = field(default_factory=dict)


def fit_open_files(limits: EdgeLimits) -> None:
    """Raise this process's open-file limit to fit the connection cap, as far as the hard limit
    lets it; a cap over what it allows is logged (the kernel then refuses connections first)."""
    if not limits.max_connections:
        return
    needed = limits.max_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            log.warning("the open-file limit (%d) leaves room for fewer than --http-max-connections=%d client "
                        "connections: past it, connections fail when accepted", target, limits.max_connections)
