"""Where every request of the router is: queued in its version's batcher, or in a
batch on a worker; one method per transition.

The ``Ledger`` is the one owner of that bookkeeping, and of when a request stops *waiting*
(``scheduling/overload.py``): ``returned``, ``responded`` and ``closed`` release it; the
dispatcher does for what it takes out of a queue unrun. Admission, dispatch, results
and the worker pool tell it what happened to a request and ask it where requests
are; none of them holds its dicts. The transitions are plain dict operations on
keys the caller has at hand: the request path pays no allocation here.

    queued ──started──> in a batch ──returned──> gone      (the BatchResult answers every item)
       │                    ├─responded (decoupled: its first response; it stops waiting)
       │                    └─closed (decoupled: each item's final response), then gone
       └──unqueued──> gone  (expired, cancelled, its version not ready: the router answers it)

A worker lost: its batches (``batches_on``) are failed through ``Results``, which
calls ``returned``/``closed`` as for any answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from conveyor.router.models import Instance, VersionState
from conveyor.router.pending import Pending
from conveyor.router.scheduling.overload import release

RequestKey = tuple[bytes, int]  # (ingress identity, its request id)


@dataclass(slots=True, eq=False)
class Running:
    """A batch on a worker.

    A decoupled model's batch stays after its execute returned (``executing``
    False: the instance is free again, as in Triton) until every item has had
    its final ``ItemResponse``; ``open`` says which items still wait for theirs.
    """

    instance: Instance
    items: list[Pending]
    dispatched_ns: int
    executing: bool = True
    open: list[bool] | None = None  # None: not decoupled, the BatchResult answers every item


class Ledger:
    __slots__ = ("_batches", "_queued", "_started")

    def __init__(self) -> None:
        self._queued: dict[RequestKey, VersionState] = {}
        self._batches: dict[int, Running] = {}
        # Every request on a worker -> (batch, index), so a Cancel can reach the model (``CancelItem``).
        self._started: dict[RequestKey, tuple[int, int]] = {}

    # --- transitions --------------------------------------------------------------------

    def queued(self, identity: bytes, request_id: int, state: VersionState) -> None:
        """Pushed into ``state``'s batcher."""
        self._queued[(identity, request_id)] = state

    def unqueued(self, identity: bytes, request_id: int) -> VersionState | None:
        """Taken out of its queue unrun (expired, cancelled, failed): the version it was
        queued for, None if it was not queued."""
        return self._queued.pop((identity, request_id), None)

    def started(self, batch: int, run: Running) -> None:
        """``run``'s items left their queue for a worker as batch ``batch``."""
        queued, started = self._queued, self._started
        blocks = 0
        for i, p in enumerate(run.items):
            key = (p.ingress, p.request.id)
            queued.pop(key, None)
            started[key] = (batch, i)
            blocks += p.prefill_blocks
        instance = run.instance
        instance.version.waiting.running += len(run.items)
        instance.open_requests += len(run.items)
        instance.prefill_blocks += blocks
        self._batches[batch] = run

    def returned(self, batch: int, run: Running) -> None:
        """The batch's execute is over (its ``BatchResult``, or its worker lost). Its items
        are gone unless the model is decoupled (or answers some of them after execute):
        those stay until their final response."""
        run.executing = False
        started = self._started
        waiting = run.instance.version.waiting
        if run.open is None:
            del self._batches[batch]
            for p in run.items:
                started.pop((p.ingress, p.request.id), None)
                release(p)
            waiting.running -= len(run.items)
            run.instance.open_requests -= len(run.items)  # answered in full: none has blocks left to compute
            return
        for p, is_open in zip(run.items, run.open, strict=True):
            if not is_open:  # answered already (or by the BatchResult itself, beside ones answered later)
                if started.pop((p.ingress, p.request.id), None) is not None:  # not closed before
                    waiting.running -= 1
                    _finished(run.instance, p)
                release(p)
        if not any(run.open):
            self._batches.pop(batch, None)

    def responded(self, item: Pending, instance: Instance) -> None:
        """A decoupled request (or one a model answers after execute) had its first response: it is
        running, and no longer waits (``scheduling/overload.py``); its prompt is computed."""
        release(item)
        _prefilled(instance, item)

    def closed(self, batch: int, run: Running, index: int) -> None:
        """A decoupled request had its final response; its batch goes with its last one."""
        assert run.open is not None
        run.open[index] = False
        p = run.items[index]
        if self._started.pop((p.ingress, p.request.id), None) is not None:
            run.instance.version.waiting.running -= 1
            _finished(run.instance, p)
        release(p)  # most were released at their first response (``responded``)
        if not run.executing and not any(run.open):
            self._batches.pop(batch, None)

    # --- questions ----------------------------------------------------------------------

    def batch(self, batch: int) -> Running | None:
        return self._batches.get(batch)

    def running_at(self, identity: bytes, request_id: int) -> tuple[int, int] | None:
        """(batch, index) of a request on a worker; None if it is not on one."""
        return self._started.get((identity, request_id))

    @property
    def busy(self) -> bool:
        """Requests are queued or on a worker (the shutdown drain waits for them)."""
        return bool(self._batches or self._queued)

    def batches_on(self, worker: bytes) -> list[tuple[int, Running]]:
        """The batches on that worker (a copy: failing them changes the ledger)."""
        return [(bid, run) for bid, run in self._batches.items() if run.instance.worker == worker]

    def runs_on(self, worker: bytes) -> bool:
        """A batch is on that worker (a leaving worker waits for it)."""
        return any(run.instance.worker == worker for run in self._batches.values())

    def busy_instances(self) -> set[int]:
        """``id()`` of every instance with a batch on it (a retired one is not unloaded yet)."""
        return {id(run.instance) for run in self._batches.values()}

    def queued_versions(self) -> set[VersionState]:
        """The versions with a request of the router queued."""
        return set(self._queued.values())

    def in_flight(self) -> dict[VersionState, int]:
        """Requests queued or on a worker, per version (Triton's shutdown lines count them)."""
        counts: dict[VersionState, int] = {}
        for state in self._queued.values():
            counts[state] = counts.get(state, 0) + 1
        for run in self._batches.values():
            state = run.instance.version
            counts[state] = counts.get(state, 0) + len(run.items)
        return counts

    def running_requests(self) -> Iterator[Pending]:
        """Every request on a worker."""
        for run in self._batches.values():
            yield from run.items

    def __len__(self) -> int:
        """Requests in the router: queued or on a worker."""
        return len(self._queued) + len(self._started)


def _finished(instance: Instance, p: Pending) -> None:
    """``p`` no longer loads ``instance`` (engine placement weighs what each engine runs)."""
    instance.open_requests -= 1
    _prefilled(instance, p)


def _prefilled(instance: Instance, p: Pending) -> None:
    if p.prefill_blocks:
        instance.prefill_blocks -= p.prefill_blocks
        p.prefill_blocks = 0
