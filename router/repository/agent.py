"""The repository agent: the router's slow repository work, on threads of its own.

The router's loop never waits on a disk, a network, a child process or the parsing of a
model file. Preparing a load (reading and completing a model's config: a Python model's
``auto_complete_config`` runs in a child process, an ONNX graph is read), mirroring cloud
repositories, listing and fingerprinting model directories all run here, and so does opening
the files clients name as shared-memory keys (any of them may be a FIFO). A job is a
function of values the loop hands over (paths, settings, snapshots) that touches none of
the loop's state; its outcome, a value or the exception it raised, comes back to the loop
as a completion, run there in arrival order (``drain``, once the descriptor ``fd`` polls
readable). So the loop stays the only writer of the registry, and every state change
still happens in one loop turn.

Work goes to one of three lanes, so quick work never queues behind slow work:

- ``LOAD``: preparing one model's load, ``--model-load-thread-count`` threads (Triton's
  load threads): loads of different models proceed in parallel;
- ``SYNC``: mirroring the remote repositories (and listing them right after), one thread:
  a mirror is synced by one thread at a time, in the order asked;
- ``SCAN``: listing and fingerprinting local repositories, the index, registration
  checks, removing directories a load wrote;
- ``SHM``: opening the keys of client shared-memory registrations, and the periodic check
  of registered segments (``router/shared_memory/client_regions.py``), one thread: quick,
  and never behind a scan.

The slow parts release the GIL (a child process waited on, sockets, files), and ONNX
graphs are read without their weights (``proto/onnx_graph.py``): the loop thread keeps running.
"""

from __future__ import annotations

import enum
import logging
import queue
import select
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from conveyor.deploy.runtime.dispatch_cpu import release_thread
from conveyor.deploy.runtime.wake_pipe import WakePipe

log = logging.getLogger(__name__)

DEFAULT_LOAD_THREADS = 4  # Triton's --model-load-thread-count default
SCAN_THREADS = 2

T = TypeVar("T")


class Lane(enum.Enum):
    LOAD = "load"
    SYNC = "sync"
    SCAN = "scan"
    SHM = "shm"


class _Threads:
    """Up to ``size`` daemon threads taking work from one queue, started as work comes. Daemon
    threads: the router exits without waiting for a load still being prepared (the child process
    a Python model's completion runs in dies with it)."""

    def __init__(self, name: str, size: int) -> None:
        self._name = name
        self._size = max(1, size)
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for work no submission has counted on yet
        self._started = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1  # a waiting thread takes it
            elif self._started < self._size:
                self._started += 1
                threading.Thread(target=self._serve, name=f"{self._name}-{self._started}", daemon=True).start()
        self._work.put(job)

    def _serve(self) -> None:
        # Off the dispatch core (deploy/runtime/dispatch_cpu.py): this is a worker's instance threads' kind of
        # work, and a child process started here inherits the thread's CPUs.
        release_thread()
        while True:
            job = self._work.get()
            if job is None:
                return
            job()
            with self._lock:
                self._idle += 1

    def stop(self) -> None:
        for _ in range(self._started):
            self._work.put(None)


class RepositoryAgent:
    def __init__(self, load_threads: int = DEFAULT_LOAD_THREADS) -> None:
        self._lanes = {lane: _Threads(f"repository-{lane.value}", n)
                       for lane, n in ((Lane.LOAD, load_threads), (Lane.SYNC, 1), (Lane.SCAN, SCAN_THREADS),
                                       (Lane.SHM, 1))}
        self._done: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = WakePipe()  # a completion wakes the loop
        self.pending = 0  # jobs submitted whose completion has not run (the loop's count alone)

    @property
    def fd(self) -> int:
        """Readable when completions wait: the loop polls it beside its sockets."""
        return self._wake.fd

    def submit(self, lane: Lane, work: Callable[[], T], then: Callable[[T | Exception], None]) -> None:
        """Run ``work`` on ``lane``; ``then`` gets its result, or the exception it raised, on the
        loop (``drain``). ``work`` must not touch the loop's state."""
        self.pending += 1
        self._lanes[lane].submit(lambda: self._run(work, then))

    def _run(self, work: Callable[[], T], then: Callable[[T | Exception], None]) -> None:
        try:
            outcome: T | Exception = work()
        except Exception as exc:  # a value for the loop, which knows what it means for the caller
            outcome = exc
        self._done.put(lambda: then(outcome))
        self._wake.wake()

    def drain(self) -> bool:
        """Run the completions that arrived (on the loop); whether any ran."""
        self._wake.clear()
        ran = False
        while True:
            try:
                done = self._done.get_nowait()
            except queue.Empty:
                return ran
            self.pending -= 1
            ran = True
            done()

    def wait(self, timeout_s: float = 600.0) -> None:
        """Outside the loop (start-up in tests and tools): run completions until no job is
        left, those that completions start included."""
        deadline = time.monotonic() + timeout_s
        while self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.pending} repository job(s) still running after {timeout_s:.0f}s")
            select.select([self._wake.fd], [], [], left)
            self.drain()

    def close(self) -> None:
        """Stop the threads once their work is done; outcomes still to come are dropped."""
        for lane in self._lanes.values():
            lane.stop()
        if not self.pending:  # else a thread still writes to the pipe: it goes with the process
            self._wake.close()


def logged(what: str) -> Callable[[object], None]:
    """A completion for work whose outcome matters to nobody (a directory removed): a failure is logged."""

    def then(outcome: object) -> None:
        if isinstance(outcome, Exception):
            log.warning("%s: %s", what, outcome)

    return then
