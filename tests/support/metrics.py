"""A running group's ``/metrics`` as a test reads it."""

from __future__ import annotations

import urllib.request

from tests.support.group import Server


def metrics_text(server: Server) -> str:
    """The Prometheus text the metrics ingress serves."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def scrape(server: Server) -> dict[str, float]:
    """Every sample: ``name{labels}`` -> value."""
    out = {}
    for line in metrics_text(server).splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out
