"""moto's S3 server in a process of its own, answering every request ``delay`` seconds late
while a flag file exists: an object store that is slow (or far away) on demand.

A process of its own so that serving the store takes no time from the test's own
threads (its clients' latencies are what a test measures)::

    python -m tests.support.slow_s3 PORT DELAY_S FLAG_FILE
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any


def _serve(port: int, delay_s: float, flag: str) -> None:
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)

    def slow(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if os.path.exists(flag):
            time.sleep(delay_s)
        return app(environ, start_response)

    make_server("127.0.0.1", port, slow, threaded=True, request_handler=MotoRequestHandler).serve_forever()


@contextlib.contextmanager
def slow_s3(port: int, delay_s: float, flag: str) -> Iterator[str]:
    """The server on ``127.0.0.1:port`` for the block; yields its endpoint URL."""
    import boto3

    proc = subprocess.Popen([sys.executable, "-m", "tests.support.slow_s3", str(port), str(delay_s), flag],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client("s3", endpoint_url=url)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.list_buckets()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    _serve(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3])
