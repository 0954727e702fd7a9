"""The PINGs of one connection as gRPC core counts them (chttp2's ping abuse policy and
``max_pings_without_data``), without the engine or the timers.

A client PING sooner than ``min_recv_ping_interval_s`` after its last (two hours where no call runs
and PINGs without calls are not permitted) is a strike; past ``max_ping_strikes`` the connection is
ended (``too_many_pings``). The server sends at most ``max_pings_without_data`` keepalive PINGs in a
row. Both counts start over when the server has written (``reset``: headers, a message, trailers or
a connection WINDOW_UPDATE, as core's ``grpc_chttp2_reset_ping_clock``); nothing the client sends
resets them.
"""

from __future__ import annotations

from conveyor.ingress.grpc.h2_server.limits import NO_CALLS_PING_INTERVAL_S, Keepalive


class PingPolicy:
    __slots__ = ("_keepalive", "_last_ping", "_pings_sent", "_strikes")

    def __init__(self, keepalive: Keepalive) -> None:
        self._keepalive = keepalive
        self._last_ping = -1e18  # when the client last PINGed
        self._pings_sent = 0  # keepalive PINGs since the server last wrote
        self._strikes = 0  # the client's PINGs too soon since the server last wrote

    def reset(self) -> None:
        self._strikes, self._last_ping, self._pings_sent = 0, -1e18, 0

    def may_ping(self, calls: bool) -> bool:
        """Whether a keepalive PING may go now (``calls``: a call runs on the connection)."""
        keepalive = self._keepalive
        spent = keepalive.max_pings_without_data and self._pings_sent >= keepalive.max_pings_without_data
        return not spent and (calls or keepalive.permit_without_calls)

    def pinged(self) -> None:
        self._pings_sent += 1

    def client_ping(self, now: float, calls: bool) -> bool:
        """The client PINGed: False once it has earned more strikes than allowed."""
        keepalive = self._keepalive
        interval = (keepalive.min_recv_ping_interval_s if calls or keepalive.permit_without_calls
                    else NO_CALLS_PING_INTERVAL_S)
        if now < self._last_ping + interval:
            self._strikes += 1
            if keepalive.max_ping_strikes and self._strikes > keepalive.max_ping_strikes:
                return False
        self._last_ping = now
        return True
