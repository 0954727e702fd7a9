"""The gRPC server's limits, each beside the attack it stops (docs/SECURITY.md lists them with
what an offending client sees), and the token bucket the rate limits spend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import h2.frame_buffer

# --- Limits, each beside the attack it stops ---------------------------------------------------

# Streams one connection may have open. Advertised in SETTINGS_MAX_CONCURRENT_STREAMS; a HEADERS
# past it is refused with RST_STREAM REFUSED_STREAM, which gRPC clients retry (they keep to the
# setting, so only a client that ignores it meets this). Stops HEADERS that never send DATA
# (200 per write): each would hold a call, its task and its deadline timer for as long as the
# client likes.
MAX_CONCURRENT_STREAMS = 256
# What of one read is handed to h2 at a time, the rest after other connections had their turn:
# about FEED_FRAMES frames (h2's events tell how many the last piece held), in pieces of
# FEED_MIN_BYTES to FEED_MAX_BYTES. A read of 256 KiB of tiny frames is 20,000 frames, a second of
# h2's time; fed whole, every other client on the process would wait that long. Large DATA frames
# still go through in pieces of FEED_MAX_BYTES.
FEED_FRAMES = 64
# The same bound on the ngh2 engine, in its events (about five per unary call): nghttp2 parses in C and an event
# costs the connection a few µs of Python where a frame costs h2 some tens, so a piece of this many takes no longer
# than one of FEED_FRAMES on h2, and a read of 16 calls is handled in one piece (one loop turn, one write).
NGH2_FEED_FRAMES = 4 * FEED_FRAMES
FEED_MIN_BYTES = 1 << 10
FEED_MAX_BYTES = 1 << 16
# Request heads (parsed request headers) one connection on the ngh2 engine keeps, by their header list: a client's
# calls repeat the same few lists, each then parsed once. At most this many, each of a list of at most
# HEAD_CACHE_BYTES (RFC 9113's accounting; a larger one is parsed every time): a client sending ever new lists
# makes the connection hold no more than their product, and costs it a parse per call as without the cache.
HEAD_CACHE_ENTRIES = 16
HEAD_CACHE_BYTES = 4096
# h2 treats a stream over its own limit as a connection error (TooManyStreamsError, GOAWAY
# PROTOCOL_ERROR) where RFC 9113 §5.1.2 asks for a stream error, and it opens every stream of
# what it is fed before the server sees one. Its limit is set above ours by as many streams as
# one piece can open (a HEADERS frame with an indexed request is 12 bytes), so that the refusal
# above comes first.
H2_STREAM_CEILING = MAX_CONCURRENT_STREAMS + FEED_MAX_BYTES // 12

# Streams a client may reset while they run, or have refused, at once and then per second (a
# token bucket; nghttp2 allows 1000 and 33). Rapid reset (CVE-2023-44487): HEADERS + RST_STREAM,
# 200 per write, make the server take a call for each at no cost to the client. Past the budget
# the connection ends with GOAWAY ENHANCE_YOUR_CALM. A client may cancel every call it can have
# open, twice over, at once.
RESET_BURST = 2 * MAX_CONCURRENT_STREAMS
RESET_RATE_PER_S = 33.0
# nghttp2's own rapid-reset limiter on the ngh2 engine, (burst, per second): its default, above
# RESET_BURST so that the budget above (GOAWAY ENHANCE_YOUR_CALM) trips first; nghttp2's answer
# would be GOAWAY INTERNAL_ERROR.
NGH2_RESET_RATE = (1000, 33)

# CONTINUATION frames one header block may have: h2's own cap (a ProtocolError, GOAWAY
# PROTOCOL_ERROR, past it). With frames of at most MAX_FRAME_SIZE it bounds the header block
# buffered before HPACK sees it (the flood of empty CONTINUATION frames that never end a block).
MAX_CONTINUATION_FRAMES = h2.frame_buffer.CONTINUATION_BACKLOG
# Largest frame the client may send (SETTINGS_MAX_FRAME_SIZE): HTTP/2's default. Kept at it so
# that a header block stays under MAX_HEADER_BLOCK_BYTES; DATA frames are the client's to size.
MAX_FRAME_SIZE = 16_384
MAX_HEADER_BLOCK_BYTES = (MAX_CONTINUATION_FRAMES + 1) * MAX_FRAME_SIZE
# The same cap on the ngh2 engine: nghttp2's default (CVE-2024-28182). 9 frames of MAX_FRAME_SIZE hold a
# header block over MAX_HEADER_LIST_SIZE; past it the connection ends with GOAWAY ENHANCE_YOUR_CALM.
NGH2_MAX_CONTINUATIONS = 8
# Largest decoded header list (SETTINGS_MAX_HEADER_LIST_SIZE, enforced by h2's HPACK decoder as it
# decodes): metadata that large is refused with GOAWAY ENHANCE_YOUR_CALM. grpc clients send a few
# hundred bytes; 64 KiB is h2's own default and what grpcio's peers accept.
MAX_HEADER_LIST_SIZE = 1 << 16
# On the ngh2 engine a header list over nghttp2's limit ends the connection (gRPC core resets only
# the stream): its limit is set this far above MAX_HEADER_LIST_SIZE, so that one call whose metadata
# is over MAX_HEADER_LIST_SIZE (RFC 9113's accounting) gets RESOURCE_EXHAUSTED of its own and the
# connection lives; a list past this one is an attack (GOAWAY ENHANCE_YOUR_CALM). A block this size
# fits in the NGH2_MAX_CONTINUATIONS + 1 frames nghttp2 takes.
NGH2_HEADER_LIST_SIZE = 2 * MAX_HEADER_LIST_SIZE

# PING and SETTINGS frames (each of which the server must acknowledge) a client may send at once
# and then per second (a token bucket). gRPC clients send a few: their SETTINGS, a ping to measure
# the bandwidth-delay product now and then (10 in 4,800 calls of tritonclient at concurrency 16),
# keepalive pings if asked for (grpcio's own server allows one per 5 minutes without data). A
# flood of them ends with GOAWAY ENHANCE_YOUR_CALM.
INDUCED_BURST = 1000
INDUCED_RATE_PER_S = 100.0
# On the ngh2 engine, nghttp2's own cap on acknowledgements queued and not yet written (its default):
# past it the connection ends with GOAWAY ENHANCE_YOUR_CALM. The server writes after each piece it
# feeds (FEED_*), so the budget above trips first; this one is for a peer that does not read.
NGH2_MAX_OUTBOUND_ACK = 1000
# The transport's write buffer past which the connection stops reading (and streaming replies
# wait): a peer that does not read cannot make the server buffer what its frames induce (PING
# and SETTINGS acknowledgements, RST_STREAM for frames on closed streams) nor anything else
# without end; reading resumes as the buffer drains below a quarter of it.
WRITE_BUFFER_HIGH = 1 << 20
# A connection the server closes gets this long to take what is still to be written (its GOAWAY),
# then it is aborted: a peer that does not read would otherwise keep it, and its buffer, forever.
CLOSE_TIMEOUT_S = 5.0
# A closing connection sends its GOAWAY and FIN, then reads (and drops) what the peer still sends for
# this long before closing: a socket closed with unread bytes sends RST, and a peer's kernel drops what
# it had not yet read on RST, the GOAWAY (why the connection ended) with it. The peer's FIN ends the
# wait sooner; the bytes read meanwhile cost one discarded read each.
LINGER_S = 1.0
# How long a TLS client may take to finish its handshake (asyncio's ssl_handshake_timeout, whose default is
# 60 s; gRPC core's is 120 s): a client that connects and never finishes it holds a socket and the TLS
# state of a connection the server cannot yet see, at no cost of its own. A handshake is two round trips.
TLS_HANDSHAKE_TIMEOUT_S = 10.0

# Receive windows. The server credits data back only as it is consumed (module docstring); h2
# answers a client that sends past a window with GOAWAY FLOW_CONTROL_ERROR. These are where each
# connection's windows start; they grow with the link (below).
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 1 << 24
# The windows grow with the link's bandwidth-delay product as gRPC core's do (chttp2 flow control and
# BdpEstimator): once BDP_PROBE_BYTES have arrived the server PINGs; what arrives before the client's ACK
# is a sample of the BDP, and a sample over 2/3 of the estimate at a higher bandwidth doubles the
# estimate (at least to the sample). The stream window (SETTINGS_INITIAL_WINDOW_SIZE) becomes twice the
# estimate, the connection's twice that. A fixed window caps one call's upload at window / RTT (1 MiB
# at 50 ms: 20 MiB/s). Connections that receive less than BDP_PROBE_BYTES at a time never PING.
BDP_PROBE_BYTES = 1 << 18
# Between probes: core's first inter-ping delay, halved while the estimate grows, doubled while it
# holds, up to core's 10 s: a steady upload costs a PING every 10 s.
BDP_PROBE_GAP_S = 0.1
BDP_PROBE_MIN_GAP_S = 0.01
BDP_PROBE_MAX_GAP_S = 10.0
# How far the windows grow: one call at 64 MiB per 50 ms round trip (1.3 GB/s), two such on a
# connection. Bytes a client sends within the windows are held against the buffer budgets
# (--grpc-max-connection-buffer-bytes, --grpc-max-buffer-bytes) as before; the windows never grow past
# the smaller of those either (``window_cap``), so that a client that fills the windows of calls whose
# handlers do not read is stopped by flow control, not the budgets, as with the starting windows.
MAX_STREAM_WINDOW = 1 << 26
MAX_CONNECTION_WINDOW = 1 << 27


def window_cap(*budgets: int) -> int:
    """How far a connection's windows may grow under these buffer budgets (0: no limit)."""
    return min([MAX_CONNECTION_WINDOW, *(b for b in budgets if b)])

# Closed streams h2 remembers, to tell a late frame on a reset stream from one on an ended one
# (h2's default, 65,536, holds about 14 MiB on a long-lived connection). Late frames come within
# a round trip; a stream forgotten is answered as h2 answers any closed stream (RST_STREAM).
CLOSED_STREAMS_REMEMBERED = 1024


class TokenBucket:
    """``burst`` events at once, then ``rate`` per second (RESET_*, INDUCED_*)."""

    __slots__ = ("_at", "_burst", "_rate", "_tokens")

    def __init__(self, burst: int, rate: float, now: float) -> None:
        self._burst = self._tokens = float(burst)
        self._rate = rate
        self._at = now

    def spend(self, now: float) -> bool:
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


# --- Keepalive and connection age (Triton's --grpc-keepalive-* and --grpc-max-connection-age* flags) -----

# What an unset flag means: gRPC core's server defaults (grpc/grpc doc/keepalive.md).
KEEPALIVE_TIME_S = 7200.0  # grpc.keepalive_time_ms: a PING every two hours
KEEPALIVE_TIMEOUT_S = 20.0  # grpc.keepalive_timeout_ms: no ACK within it closes the connection
MIN_RECV_PING_INTERVAL_S = 300.0  # grpc.http2.min_ping_interval_without_data_ms
MAX_PING_STRIKES = 2  # grpc.http2.max_ping_strikes
MAX_PINGS_WITHOUT_DATA = 2  # grpc.http2.max_pings_without_data: the server's PINGs between data; 0: no limit
NO_CALLS_PING_INTERVAL_S = 7200.0  # core: a client PINGing a connection with no calls, unpermitted, earns a strike
MAX_AGE_JITTER = 0.1  # core spreads each connection's max age by +-10% so that clients do not reconnect at once


@dataclass(frozen=True)
class Keepalive:
    """The server's keepalive PINGs, its policy for the client's PINGs, and the connections' maximum age,
    as gRPC core's channel arguments set them (``from_options``)."""

    time_s: float = KEEPALIVE_TIME_S
    timeout_s: float = KEEPALIVE_TIMEOUT_S
    permit_without_calls: bool = False  # PINGs (both ways) on a connection with no call running
    max_pings_without_data: int = MAX_PINGS_WITHOUT_DATA
    min_recv_ping_interval_s: float = MIN_RECV_PING_INTERVAL_S
    max_ping_strikes: int = MAX_PING_STRIKES  # 0: no limit
    max_age_s: float | None = None  # None: no limit
    max_age_grace_s: float | None = None  # None: the running calls may take as long as they like

    @classmethod
    def from_options(cls, options: Sequence[tuple[str, Any]]) -> Keepalive:
        """From grpc server options (``deploy.options.grpc_keepalive_options``); others are ignored."""
        o = dict(options)

        def seconds(name: str) -> float | None:
            return None if name not in o else int(o[name]) / 1000

        return cls(
            time_s=seconds("grpc.keepalive_time_ms") or KEEPALIVE_TIME_S,
            timeout_s=seconds("grpc.keepalive_timeout_ms") or KEEPALIVE_TIMEOUT_S,
            permit_without_calls=bool(o.get("grpc.keepalive_permit_without_calls", 0)),
            max_pings_without_data=int(o.get("grpc.http2.max_pings_without_data", MAX_PINGS_WITHOUT_DATA)),
            min_recv_ping_interval_s=(
                MIN_RECV_PING_INTERVAL_S if "grpc.http2.min_ping_interval_without_data_ms" not in o
                else int(o["grpc.http2.min_ping_interval_without_data_ms"]) / 1000),
            max_ping_strikes=int(o.get("grpc.http2.max_ping_strikes", MAX_PING_STRIKES)),
            max_age_s=seconds("grpc.max_connection_age_ms"),
            max_age_grace_s=seconds("grpc.max_connection_age_grace_ms"),
        )
