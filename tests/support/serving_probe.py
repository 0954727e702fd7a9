"""One model driven by a few client threads while something else happens to the server
(a slow load, say), and what those clients saw: how many calls failed, and their p99."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.http as th
from tritonclient.utils import InferenceServerException


@dataclass(frozen=True)
class Call:
    start: float  # time.monotonic() when it was sent
    seconds: float
    error: str  # "" when it succeeded


@dataclass(frozen=True)
class Window:
    calls: int
    failed: list[str]
    p99_s: float

    def __str__(self) -> str:
        return f"{self.calls} calls, {len(self.failed)} failed, p99 {self.p99_s * 1e3:.1f} ms"


def p99(seconds: list[float]) -> float:
    if not seconds:
        return 0.0
    ordered = sorted(seconds)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


@dataclass
class Driver:
    """``concurrency`` threads, each calling ``model`` over HTTP in a loop (a closed loop, as
    perf_analyzer's concurrency mode) with the inputs ``inputs()`` makes."""

    url: str
    model: str
    inputs: Callable[[], list[Any]]
    check: Callable[[th.InferResult], None] = lambda _: None
    concurrency: int = 4
    timeout_s: float = 30.0
    calls: list[Call] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Driver:
        for _ in range(self.concurrency):
            t = threading.Thread(target=self._loop, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 5)

    def _loop(self) -> None:
        client = th.InferenceServerClient(self.url, connection_timeout=self.timeout_s,
                                          network_timeout=self.timeout_s)
        inputs = self.inputs()
        try:
            while not self._stop.is_set():
                start = time.monotonic()
                error = ""
                try:
                    self.check(client.infer(self.model, inputs))
                except InferenceServerException as exc:
                    error = str(exc.message() or exc)
                except Exception as exc:  # a timeout or a dropped connection counts as a failure too
                    error = f"{type(exc).__name__}: {exc}"
                call = Call(start, time.monotonic() - start, error)
                with self._lock:
                    self.calls.append(call)
        finally:
            client.close()

    def window(self, since: float, until: float) -> Window:
        """The calls sent in [since, until)."""
        with self._lock:
            chosen = [c for c in self.calls if since <= c.start < until]
        return Window(len(chosen), [c.error for c in chosen if c.error],
                      p99([c.seconds for c in chosen if not c.error]))

    def wait_calls(self, n: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.calls) < n:
            assert time.monotonic() < deadline, f"only {len(self.calls)} calls in {timeout}s"
            time.sleep(0.05)


def add_sub_inputs() -> list[Any]:
    """The inputs of an unbatched FP32 [4] add/sub model (tests/support/python_models.py ADD_SUB_MODEL)."""
    a = np.arange(4, dtype=np.float32)
    inputs = [th.InferInput("INPUT0", [4], "FP32"), th.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones_like(a))
    return inputs


def check_add_sub(result: th.InferResult) -> None:
    out = result.as_numpy("OUTPUT0")
    if out is None or out.reshape(-1).tolist() != [1.0, 2.0, 3.0, 4.0]:
        raise AssertionError(f"wrong answer: {out}")
