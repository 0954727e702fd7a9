"""What is watched while a hostile HTTP/2 client runs (``h2_attacks``): a ``Victim``
(tritonclient gRPC, another connection) calls ``simple`` every 20 ms, and an ``IngressWatch``
samples the gRPC ingress process's RSS and CPU time from ``/proc``. ``python -m
tests.support.h2_watch victim URL SECONDS`` runs a ``Victim`` in a process of its own."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import numpy as np

from conveyor.deploy.runtime.procs import cpu_seconds

PAGE = os.sysconf("SC_PAGE_SIZE")


# --------------------------------------------------------------------------- watching the ingress

def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE


class IngressWatch:
    """RSS and CPU time of one process, sampled every ``interval`` seconds on a thread."""

    def __init__(self, pid: int, interval: float = 0.05, cap: int | None = None,
                 over_cap: Callable[[], None] | None = None) -> None:
        self.pid = pid
        self.interval = interval
        self.cap, self._over_cap = cap, over_cap  # past ``cap`` bytes of RSS, ``over_cap()`` (once)
        self.capped = False
        self.rss_start = rss_bytes(pid)
        self.rss_peak = self.rss_start
        self.cpu_start = cpu_seconds(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> IngressWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.rss_peak = max(self.rss_peak, rss_bytes(self.pid))
            except OSError:
                return
            if self.cap is not None and self.rss_peak > self.cap and not self.capped:
                self.capped = True
                if self._over_cap is not None:
                    self._over_cap()

    @property
    def rss_growth(self) -> int:
        return self.rss_peak - self.rss_start

    def cpu_used(self) -> float:
        return cpu_seconds(self.pid) - self.cpu_start

    def wait_idle(self, timeout: float, window: float = 0.5, busy: float = 0.1) -> float | None:
        """Seconds until the process used less than ``busy`` of a core over ``window``; None if
        it did not within ``timeout``."""
        start = time.monotonic()
        try:
            last = cpu_seconds(self.pid)
            while time.monotonic() - start < timeout:
                time.sleep(window)
                now = cpu_seconds(self.pid)
                if now - last < busy * window:
                    return time.monotonic() - start
                last = now
        except OSError:  # the process is gone
            return None
        return None



# --------------------------------------------------------------------------- the well-behaved client

class Victim:
    """tritonclient gRPC calling ``simple`` every ``period`` s on its own connection, on a thread."""

    def __init__(self, url: str, period: float = 0.02, timeout_s: float = 5.0) -> None:
        import tritonclient.grpc as grpcclient

        self._client = grpcclient.InferenceServerClient(url)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        self._inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
                        grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        for i in self._inputs:
            i.set_data_from_numpy(a)
        self._expected = 2 * a
        self._period = period
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.ok = 0
        self.failed = 0
        self.errors: list[str] = []
        self.started = self.stopped = 0.0
        self.first_ok_at: float | None = None

    def call(self) -> None:
        result = self._client.infer("simple", self._inputs, client_timeout=self._timeout_s)
        out = result.as_numpy("OUTPUT0")
        assert out is not None and (out == self._expected).all()

    def __enter__(self) -> Victim:
        self.call()  # the connection is up before the attack starts
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self._timeout_s + 5)
        self.stopped = time.monotonic()
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.call()
                self.ok += 1
            except Exception as exc:
                self.failed += 1
                if len(self.errors) < 5:
                    self.errors.append(str(exc)[:200])
            self._stop.wait(max(0.0, self._period - (time.monotonic() - began)))

    @property
    def calls_per_s(self) -> float:
        return self.ok / max(1e-9, (self.stopped or time.monotonic()) - self.started)


# --------------------------------------------------------------------------- the client, in a process of its own

def victim_main(url: str, seconds: float) -> None:
    """``Victim`` for ``seconds`` in this process; prints "ready" once its connection is up, then its
    figures as JSON. The attacks are Python too: in one process they would share the GIL with it."""
    import json
    import sys

    with Victim(url) as v:
        print("ready", flush=True)
        time.sleep(seconds)
    print(json.dumps({"ok": v.ok, "failed": v.failed, "errors": v.errors, "calls_per_s": round(v.calls_per_s, 1)}))
    sys.stdout.flush()


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 4 or sys.argv[1] != "victim":
        sys.exit("usage: python -m tests.support.h2_watch victim URL SECONDS")
    victim_main(sys.argv[2], float(sys.argv[3]))
