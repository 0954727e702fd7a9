"""Free loopback ports for the groups that tests, benchmarks and the GPU check start."""

from __future__ import annotations

import socket

# Ports this process already handed out. Once a probe socket is closed the kernel may give the same
# ephemeral port to the next bind, so two calls in a row can return one port; ``serve`` then refuses
# to put HTTP and gRPC on one address (a CI run failed that way).
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on now, and not one this process was given before."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports."""
    return [free_port() for _ in range(n)]
