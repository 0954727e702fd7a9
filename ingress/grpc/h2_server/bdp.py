"""Receive windows that grow with the link: gRPC core's bandwidth-delay-product estimator
(``BdpEstimator`` and chttp2's flow control), without the engine.

Once ``BDP_PROBE_BYTES`` have arrived the connection sends a PING; the bytes that arrive before its
ACK are one sample of the bandwidth-delay product. A sample over 2/3 of the estimate, at a higher
bandwidth than the last growth, sets the estimate to max(sample, 2 x estimate) (core's rule); the
stream window is then twice the estimate, the connection's twice that, never shrinking and never
past ``MAX_STREAM_WINDOW`` or the buffer budgets (``window_cap``). Probes are spaced: halved while
the estimate grows, doubled while it holds. The connection owns the engine calls; this owns the
arithmetic.
"""

from __future__ import annotations

from conveyor.ingress.grpc.h2_server.limits import (
    BDP_PROBE_BYTES,
    BDP_PROBE_GAP_S,
    BDP_PROBE_MAX_GAP_S,
    BDP_PROBE_MIN_GAP_S,
    CONNECTION_WINDOW,
    MAX_STREAM_WINDOW,
    STREAM_WINDOW,
)

_PROBE_OUT = 1 << 62  # probe_at while a probe is out: past any byte count


class BdpEstimator:
    """One connection's estimate and windows. ``probe_at`` is read on every DATA frame: the only
    per-frame cost is the connection's addition and comparison."""

    __slots__ = (
        "_after",
        "_bandwidth",
        "_bdp",
        "_cap",
        "_from",
        "_gap",
        "_sent",
        "connection_window",
        "probe_at",
        "received",
        "stream_window",
    )

    def __init__(self, cap: int) -> None:
        self.received = 0  # flow-controlled bytes received on the connection
        self.probe_at = BDP_PROBE_BYTES  # ``received`` at which a probe may start
        self._sent = 0.0  # when the probe's PING left
        self._from = 0  # ``received`` then
        self._after = 0.0  # no probe before this loop time
        self._gap = BDP_PROBE_GAP_S
        self._bdp = STREAM_WINDOW // 2  # the starting windows are twice it
        self._bandwidth = 0.0  # bytes per second at the last growth
        self._cap = cap  # limits.window_cap: the buffer budgets
        self.stream_window = STREAM_WINDOW
        self.connection_window = CONNECTION_WINDOW

    def probe(self, now: float) -> bool:
        """``probe_at`` was reached: whether to send the probe's PING now (not while one is out or too soon)."""
        if now < self._after:
            self.probe_at = self.received + BDP_PROBE_BYTES
            return False
        self._sent, self._from = now, self.received
        self.probe_at = _PROBE_OUT
        return True

    def acked(self, now: float) -> bool:
        """The probe's ACK came: whether the windows grew (``stream_window``, ``connection_window``)."""
        if self.probe_at != _PROBE_OUT:  # an ACK of no probe of this connection's
            return False
        sample = self.received - self._from
        elapsed = now - self._sent
        bandwidth = sample / elapsed if elapsed > 0 else 0.0
        grew = False
        if sample > 2 * self._bdp // 3 and bandwidth > self._bandwidth:  # core's rule
            self._bdp = max(sample, 2 * self._bdp)
            self._bandwidth = bandwidth
            self._gap = max(BDP_PROBE_MIN_GAP_S, self._gap / 2)
            grew = self._grow()
        else:
            self._gap = min(BDP_PROBE_MAX_GAP_S, 2 * self._gap)
        self._after = now + self._gap
        self.probe_at = self.received + BDP_PROBE_BYTES
        return grew

    def _grow(self) -> bool:
        cap = self._cap
        stream = min(2 * self._bdp, MAX_STREAM_WINDOW, cap)
        connection = max(self.connection_window, min(2 * stream, cap))
        if stream <= self.stream_window and connection <= self.connection_window:
            return False
        self.stream_window = max(stream, self.stream_window)
        self.connection_window = connection
        return True
