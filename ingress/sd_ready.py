"""Tell systemd when an ingress process really serves, and keep its watchdog fed.

READY=1 waits for two things: the process listens (a balancer may send it
traffic) and the router answers a ping (that traffic would get answers).
WATCHDOG=1 comes from a task on the event loop, so a blocked loop stops it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from conveyor.deploy.runtime.sd_notify import Notifier
from conveyor.proto.control import RouterClient

# How long one readiness ping may take before it is tried again.
PING_TIMEOUT_S = 2.0
TICK_S = 0.5


async def notify_when_serving(link: RouterClient, listening: Callable[[], bool], notifier: Notifier) -> None:
    """Runs until cancelled: READY=1 once serving, WATCHDOG=1 all along."""
    if not notifier.enabled:
        return
    while True:
        notifier.beat()
        if not notifier.ready_sent and listening():
            try:
                await asyncio.wait_for(link.ping(), PING_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception:
                pass  # the router is not there yet: try again on the next tick
            else:
                notifier.ready("listening; the router answers")
        await asyncio.sleep(TICK_S)
