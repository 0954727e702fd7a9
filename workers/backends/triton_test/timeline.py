"""Timed response schedules for the test backends that answer after ``execute`` returned
(``repeat``, ``square``): one thread per instance runs every request's schedule.

Triton's C++ backends start a detached thread per request that sleeps between responses. Here
each request's responses are a generator that yields the seconds to wait before its next step;
one thread per instance steps them all in due order, so any number of concurrent requests costs
no more threads (a request's waits are its own: a long one delays no other request)."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Generator

from conveyor.deploy.runtime.dispatch_cpu import release_thread
from conveyor.proto.errors import ConveyorError, internal, unavailable

log = logging.getLogger(__name__)

# A schedule: the seconds to wait before each next step; its body sends the responses.
Schedule = Generator[float, None, None]
OnError = Callable[[ConveyorError], None]


class Timeline:
    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        # (due, order, schedule, on_error): the order keeps two schedules due at once in their start order.
        self._due: list[tuple[int, int, Schedule, OnError]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self, schedule: Schedule, on_error: OnError) -> None:
        """Run ``schedule``'s first step now (on the timeline's thread); ``on_error`` ends its
        request when a step raises."""
        with self._cond:
            if self._closed:
                on_error(unavailable("the model instance is unloading"))
                return
            heapq.heappush(self._due, (time.monotonic_ns(), next(self._order), schedule, on_error))
            if self._thread is None:  # the first request: an instance that never streams keeps no thread
                self._thread = threading.Thread(target=self._run, name=f"{self._name}-responses", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        """Stop stepping: the schedules not done are dropped (the worker ends their requests when it
        unloads the instance)."""
        with self._cond:
            self._closed = True
            dropped, self._due = self._due, []
            self._cond.notify()
        for _, _, schedule, _ in dropped:
            schedule.close()

    def _run(self) -> None:
        release_thread()  # off the dispatch core, as an instance's own thread
        while True:
            with self._cond:
                while not self._closed and (not self._due or self._due[0][0] > time.monotonic_ns()):
                    wait = (self._due[0][0] - time.monotonic_ns()) / 1e9 if self._due else None
                    self._cond.wait(wait)
                if self._closed:
                    return
                _, order, schedule, on_error = heapq.heappop(self._due)
            try:
                delay = next(schedule)
            except StopIteration:
                continue
            except ConveyorError as exc:  # its request ended (it was cancelled, its stream closed)
                on_error(exc)
                continue
            except Exception as exc:
                log.exception("a response schedule of %s failed", self._name)
                on_error(internal(f"{type(exc).__name__}: {exc}"))
                continue
            due = time.monotonic_ns() + max(0, int(delay * 1e9))
            with self._cond:
                if self._closed:
                    schedule.close()
                    return
                heapq.heappush(self._due, (due, order, schedule, on_error))
