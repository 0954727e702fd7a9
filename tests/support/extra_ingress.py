"""One more ingress process joined to a running group (its router), with its own
flags: to test an ingress variant against the same group."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from conveyor.deploy.ports import free_port
from tests.support.group import Server, _listening


@contextmanager
def extra_grpc_ingress(server: Server, *flags: str, timeout: float = 60.0) -> Iterator[str]:
    """A gRPC ingress with ``flags`` on a free loopback port of ``server``'s group; yields its address."""
    with extra_grpc_ingress_process(server, *flags, timeout=timeout) as (url, _pid):
        yield url


@contextmanager
def extra_grpc_ingress_process(server: Server, *flags: str, timeout: float = 60.0) -> Iterator[tuple[str, int]]:
    """As ``extra_grpc_ingress``; yields its address and its process id."""
    port = free_port()
    proc = subprocess.Popen([
        sys.executable, "-m", "conveyor.deploy.cli", "ingress", "--protocol", "grpc", "--group", server.group,
        "--grpc-address", "127.0.0.1", "--grpc-port", str(port), *flags,
    ])
    try:
        until = time.monotonic() + timeout
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > until:
                raise RuntimeError(f"the extra gRPC ingress did not start (exit status {proc.poll()})")
            time.sleep(0.05)
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(30)
