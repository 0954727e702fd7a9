"""One ingress process's shutdown drain (``deploy/runtime/drain.py`` has the phases).

The data plane asks ``admit`` before each request; readiness handlers read
``draining``; the server's stop path awaits ``run`` before closing its listener.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from conveyor.deploy.runtime.drain import DrainClock, Phase
from conveyor.proto.errors import unavailable

POLL_S = 0.05


class IngressDrain:
    def __init__(self, grace_s: float = 0.0, exit_timeout_s: float = 30.0) -> None:
        self.clock = DrainClock(grace_s, exit_timeout_s)

    @property
    def draining(self) -> bool:
        return self.clock.draining

    def admit(self) -> None:
        """Refuse new requests once the grace is over (they would be cut off anyway)."""
        clock = self.clock
        if clock.started is not None and clock.refusing():  # a stop requested: the cheap test first
            raise unavailable("the server is shutting down: send the request to another instance")

    async def run(self, in_flight: Callable[[], int], connections: Callable[[], int] = lambda: 0) -> None:
        """From the stop request until nothing is in flight (or the exit timeout passed).
        The grace ends early once nothing is in flight and ``connections`` (the open client
        connections, where the server knows them) is 0."""
        self.clock.begin()
        while True:
            busy = in_flight() > 0
            if self.clock.phase(busy, quiet=not busy and connections() == 0) is Phase.DONE:
                return
            await asyncio.sleep(POLL_S)
