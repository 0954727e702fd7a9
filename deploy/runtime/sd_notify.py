"""systemd's readiness and watchdog protocol (sd_notify(3)), without libsystemd.

A ``Type=notify`` unit is started once its main process sends ``READY=1`` as one
datagram to the unix socket named by ``$NOTIFY_SOCKET`` (a leading ``@`` means
the abstract namespace). With ``WatchdogSec=`` systemd sets ``$WATCHDOG_USEC``
and restarts the service when no ``WATCHDOG=1`` arrives within it. Outside
systemd there is no ``$NOTIFY_SOCKET`` and every call here does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)


def notify(message: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``message`` (e.g. ``"READY=1"``) to systemd; False when not under systemd or it failed."""
    address = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        return False  # unset, or a transport this does not speak (vsock)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("cannot notify systemd (%s): %s", message.split("\n", 1)[0], exc)
        return False
    return True


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``WatchdogSec``, as sd_watchdog_enabled(3)
    advises), or None when no watchdog watches this process."""
    env = os.environ if env is None else env
    try:
        usec = int(env.get("WATCHDOG_USEC", "0"))
        pid = int(env.get("WATCHDOG_PID", "0"))
    except ValueError:
        return None
    if usec <= 0 or (pid and pid != os.getpid()):
        return None  # WATCHDOG_PID names another process: a child inherited the variables
    return usec / 2e6


class Notifier:
    """One actor's messages to systemd: READY once, STOPPING once, WATCHDOG at its pace.

    ``beat`` is meant to be called from the actor's main loop on every turn: it
    only sends when half the watchdog period has passed, so a hung loop stops
    the pings and systemd restarts the service.
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._env = dict(os.environ if env is None else env)
        self.interval = watchdog_interval(self._env)
        self._next_beat = 0.0
        self.ready_sent = False
        self.stopping_sent = False

    @property
    def enabled(self) -> bool:
        return bool(self._env.get("NOTIFY_SOCKET"))

    def ready(self, status: str = "") -> None:
        if not self.ready_sent:
            self.ready_sent = True
            notify("READY=1" + (f"\nSTATUS={status}" if status else ""), self._env)

    def stopping(self, status: str = "") -> None:
        if not self.stopping_sent:
            self.stopping_sent = True
            notify("STOPPING=1" + (f"\nSTATUS={status}" if status else ""), self._env)

    def status(self, text: str) -> None:
        notify(f"STATUS={text}", self._env)

    def beat(self, now: float | None = None) -> None:
        if self.interval is None:
            return
        now = time.monotonic() if now is None else now
        if now >= self._next_beat:
            self._next_beat = now + self.interval
            notify("WATCHDOG=1", self._env)
