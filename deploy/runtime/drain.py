"""The shutdown drain every serving actor goes through (Triton instead unloads at
once on SIGTERM, server#6230)::

    SERVING --SIGTERM--> GRACE --grace over--> REFUSING --nothing in flight--> DONE
     ready               not ready;            not ready; new requests       unload,
                         requests served       UNAVAILABLE; in-flight        remove
                         (balancers notice)    ones finish                   segments, exit

REFUSING also ends when ``exit_timeout_s`` has passed since the grace ended
(what is still running is then cut off). The grace ends early, straight to DONE,
whenever the actor is quiet: nothing in flight (and, for the HTTP ingress, no
client connection open that could still send one): waiting then would only
delay the stop (Model Analyzer kills a server that takes over 5 s). The ingress
processes and the router each keep one ``DrainClock``; see ARCHITECTURE.md for
who does what.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass


class Phase(enum.Enum):
    SERVING = "serving"
    GRACE = "grace"
    REFUSING = "refusing"
    DONE = "done"


@dataclass
class DrainClock:
    grace_s: float = 0.0
    exit_timeout_s: float = 30.0
    started: float | None = None  # CLOCK_MONOTONIC of the stop request

    def begin(self, now: float | None = None) -> None:
        if self.started is None:
            self.started = time.monotonic() if now is None else now

    @property
    def draining(self) -> bool:
        """Readiness is false from the stop request on."""
        return self.started is not None

    def refusing(self, now: float | None = None) -> bool:
        """New requests are turned away from the end of the grace on."""
        return self.phase(busy=True, now=now) in (Phase.REFUSING, Phase.DONE)

    def time_left(self, now: float | None = None) -> float:
        """Seconds until the hard deadline (end of grace + exit timeout)."""
        if self.started is None:
            return self.grace_s + self.exit_timeout_s
        elapsed = (time.monotonic() if now is None else now) - self.started
        return max(0.0, self.grace_s + self.exit_timeout_s - elapsed)

    def phase(self, busy: bool, now: float | None = None, quiet: bool | None = None) -> Phase:
        """``busy``: requests in flight; ``quiet`` (default: not busy): nothing a client could
        still be waiting on, which ends the grace."""
        if self.started is None:
            return Phase.SERVING
        elapsed = (time.monotonic() if now is None else now) - self.started
        if elapsed < self.grace_s:
            return Phase.DONE if (not busy if quiet is None else quiet) else Phase.GRACE
        if busy and elapsed < self.grace_s + self.exit_timeout_s:
            return Phase.REFUSING
        return Phase.DONE
