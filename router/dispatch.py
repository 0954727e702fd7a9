"""Running batches: queued requests become ``ExecBatch``es on free instances.

The ``Dispatcher`` takes requests out of a version's batcher (into a batch, or
answered unrun: expired, cancelled, the version not ready), tells the ``Ledger``,
and keeps the timers that wake a version up when a batch delay or a queue timeout
is due.
"""

from __future__ import annotations

import heapq
import itertools
import time

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.context import RouterContext
from conveyor.router.ledger import Running
from conveyor.router.models import DEEP_IN_FLIGHT, Instance, InstanceState, VersionState
from conveyor.router.pending import Pending
from conveyor.router.replies import count_failure
from conveyor.router.scheduling.batcher import DynamicBatcher
from conveyor.router.scheduling.engine_placement import EnginePlacement
from conveyor.router.scheduling.overload import release
from conveyor.router.scheduling.rate_limiter import RateLimiter
from conveyor.router.scheduling.sequences import SequenceBatcher


class Dispatcher:
    def __init__(self, ctx: RouterContext) -> None:
        self.back = ctx.back
        self.limiter = ctx.limiter
        self.ledger = ctx.ledger
        self.registry = ctx.registry
        self._reply_error = ctx.replies.error
        # Ingress identity -> its reply endpoint (``IngressHello.reply_to``): workers answer it directly.
        self.reply_to: dict[bytes, str] = {}
        self.direct_items = 0  # requests dispatched so far whose worker answers the ingress itself
        self.dispatched_items = 0
        self._batch_ids = itertools.count(1)
        self._timers: list[tuple[int, int, VersionState]] = []
        self._timer_seq = itertools.count()
        self._armed: dict[VersionState, int] = {}  # each version's earliest pending wake-up

    def schedule(self, state: VersionState) -> None:
        batcher = state.batcher
        if not len(batcher) and not isinstance(batcher, SequenceBatcher):
            return  # an empty dynamic batcher has nothing to run, expire or wake up for
        now = time.monotonic_ns()
        for item, exc in batcher.take_expired(now):
            self.ledger.unqueued(item.ingress, item.request.id)
            release(item)  # its place is free for the next request
            count_failure(state, "REJECTED", now - item.arrival_ns)
            self._reply_error(item.ingress, item.request.id, state.model, state.label, exc)
        self._run_batches(state, now)
        expiry = batcher.next_expiry_ns
        if expiry:
            self._wake_at(state, expiry)  # answer timed-out requests even when nothing else happens

    def cancel(self, identity: bytes, request_id: int) -> bool:
        """Drop a queued request, or tell the worker running it (the model may stop early;
        its responses still come back and are released). False: not a request of ours."""
        state = self.ledger.unqueued(identity, request_id)
        if state is None:
            where = self.ledger.running_at(identity, request_id)
            if where is None:
                return False
            run = self.ledger.batch(where[0])
            if run is not None and run.instance.worker is not None:
                self.back.send(run.instance.worker, m.encode(m.CancelItem(*where)))
            return True
        batcher = state.batcher
        if isinstance(batcher, SequenceBatcher):  # Triton: a cancelled request cancels its whole sequence
            gone = batcher.remove_sequence(identity, request_id)
            for item in gone[1:]:
                self.ledger.unqueued(item.ingress, item.request.id)
        else:
            one = batcher.remove(identity, request_id)
            gone = [] if one is None else [one]
        now = time.monotonic_ns()
        for item in gone:
            release(item)
            count_failure(state, "CANCELED", now - item.arrival_ns)
            self._reply_error(item.ingress, item.request.id, state.model, state.label, CANCELLED)
        if gone and isinstance(batcher, SequenceBatcher):
            self.schedule(state)  # the slot it freed may go to a sequence of the backlog
        return True

    # --- timers -------------------------------------------------------------------------

    def next_timer_ns(self) -> int:
        """When the earliest wake-up is due (monotonic ns); 0: none armed."""
        return self._timers[0][0] if self._timers else 0

    def fire_timers(self) -> None:
        if not self._timers:  # every loop turn asks: no clock read when nothing is armed
            return
        now = time.monotonic_ns()
        while self._timers and self._timers[0][0] <= now:
            due, _, state = heapq.heappop(self._timers)
            if self._armed.get(state) == due:
                del self._armed[state]
            self.schedule(state)

    def _wake_at(self, state: VersionState, due_ns: int) -> None:
        armed = self._armed.get(state)
        if armed is not None and armed <= due_ns:
            return  # that earlier wake-up looks again and re-arms
        self._armed[state] = due_ns
        heapq.heappush(self._timers, (due_ns, next(self._timer_seq), state))

    # --- batches ------------------------------------------------------------------------

    def _run_batches(self, state: VersionState, now: int) -> None:
        batcher = state.batcher
        if isinstance(batcher, SequenceBatcher):
            self._run_sequences(state, batcher, now)
            return
        placement = state.placement
        while len(batcher):
            instance = self._free_instance(state) if placement is None else self._engine(state, batcher, placement)
            if instance is not None and instance.running and not _may_wait_on_worker(batcher):
                return  # it waits here, where its deadline is kept, for an instance to be free
            if instance is None:
                if not state.ready:
                    self._fail_queue(state, ConveyorError(Status.UNAVAILABLE, state.reason))
                elif self.limiter is not None:
                    self.limiter.wait(state)  # looked at again when resources are given back
                return
            batch = batcher.next_batch(now)
            if batch is None:
                return
            if isinstance(batch, int):
                self._wake_at(state, batch)
                return
            self._dispatch(state, instance, batch, now)
            if placement is not None:
                placement.sent(instance, batch[0])

    def _engine(self, state: VersionState, batcher: DynamicBatcher, placement: EnginePlacement) -> Instance | None:
        """The engine for the version's next request (``ENGINE_PLACEMENT``), among those that can
        take one now; with one such engine, that one."""
        limiter = self.limiter
        depth = 1 if limiter is not None else state.pipeline_depth
        engines = [inst for inst in state.instances if _takes(inst, depth, limiter)]
        if len(engines) < 2:
            return engines[0] if engines else None
        head = batcher.head()
        return placement.choose(engines, head) if head is not None else engines[0]

    def _free_instance(self, state: VersionState) -> Instance | None:
        """A ready instance that can take a batch now: an idle one first, else one whose
        running batch the next may queue behind (``VersionState.pipeline_depth``; deeper while
        many of the version's requests are queued or running)."""
        limiter = self.limiter
        instances = state.instances
        depth = 1 if limiter is not None else state.pipeline_depth
        if limiter is None and depth < state.deep_pipeline_depth:
            in_flight = len(state.batcher)
            for inst in instances:
                in_flight += inst.running
            if in_flight >= DEEP_IN_FLIGHT * len(instances):
                depth = state.deep_pipeline_depth
        behind: Instance | None = None
        for inst in instances:  # ``_takes``, inlined: asked for every batch
            running = inst.running
            if inst.state is _READY and running < depth and (limiter is None or limiter.free(inst)):
                if not running:
                    return inst
                if behind is None:
                    behind = inst
        return behind

    def _run_sequences(self, state: VersionState, batcher: SequenceBatcher, now: int) -> None:
        """Sequence batching: each serving instance runs the next requests of its own sequences."""
        for item, exc in batcher.sync(state.instances, now):  # their instance went away
            self.ledger.unqueued(item.ingress, item.request.id)
            release(item)
            count_failure(state, "OTHER", now - item.arrival_ns)
            self._reply_error(item.ingress, item.request.id, state.model, state.label, exc)
        for inst, slots in batcher.take_released():  # idled out: sent before any batch reuses the slots
            if inst.worker is not None:
                forget = m.ForgetSequences(state.model, state.label, inst.index, slots)
                self.back.send(inst.worker, m.encode(forget))
        if not state.ready:
            self._fail_queue(state, ConveyorError(Status.UNAVAILABLE, state.reason))
            return
        for home in batcher.homes_to_run():
            if home.instance.busy:
                continue
            batch = batcher.next_batch(home, now)
            if isinstance(batch, int):
                self._wake_at(state, batch)
            elif batch:
                self._dispatch(state, home.instance, batch, now, batcher.padded_rows(batch))

    def _dispatch(self, state: VersionState, instance: Instance, batch: list[Pending], now: int,
                  pad_to: int = 0) -> None:
        bid = next(self._batch_ids)
        items = []
        regions: list[m.ClientRegion] = []
        order = state.order
        # A worker answers the ingress itself unless the router must see the response first:
        # to hold it for ordering, to cache it or to trace it. A decoupled model's responses
        # go straight too; the router counts them from the worker's ItemResponsesSent notes.
        reply_to = self.reply_to if order is None else {}
        queue, queued = state.stats.queue, state.latency.queued
        direct = 0
        for p in batch:
            waited = now - p.arrival_ns
            queue.count += 1  # ``Duration.add``, inlined: per request
            queue.ns += waited
            if p.ensemble_stats is not None:
                p.ensemble_stats.queue.add(waited)
            queued(waited)
            if order is not None:
                p.ticket = order.ticket()
            r = p.request
            trace = p.trace
            if trace is not None:
                trace.stamp("DISPATCH")
                endpoint = ""
            else:
                endpoint = reply_to.get(p.ingress, "") if not r.cache_key else ""
                if endpoint:
                    p.direct = True
                    direct += 1
            items.append(m.BatchItem(r.id, r.inputs, r.outputs, r.parameters, r.request_id, p.sequence,
                                     trace is not None, endpoint))
            if r.regions:
                regions += r.regions
        self.direct_items += direct
        self.dispatched_items += len(batch)
        instance.running += 1
        if self.limiter is not None:
            self.limiter.acquire(instance)
        opened = [True] * len(batch) if state.runs_decoupled else None
        self.ledger.started(bid, Running(instance, batch, now, open=opened))
        msg = m.ExecBatch(bid, state.model, state.label, instance.index, items, regions, self.registry.generation,
                          pad_to)
        assert instance.worker is not None
        self.back.send(instance.worker, m.encode(msg))

    def _fail_queue(self, state: VersionState, exc: ConveyorError) -> None:
        now = time.monotonic_ns()
        while len(state.batcher):
            item = state.batcher.pop()
            self.ledger.unqueued(item.ingress, item.request.id)
            release(item)
            count_failure(state, "OTHER", now - item.arrival_ns)
            self._reply_error(item.ingress, item.request.id, state.model, state.label, exc)


_READY = InstanceState.READY
CANCELLED = ConveyorError(Status.CANCELLED, "request cancelled by the client")  # a queued request the client cancelled


def _takes(inst: Instance, depth: int, limiter: RateLimiter | None) -> bool:
    """Whether ``inst`` can take a batch now: ready, fewer than ``depth`` batches on it, and the
    rate limiter's resources free for it."""
    return inst.state is InstanceState.READY and inst.running < depth and (limiter is None or limiter.free(inst))


def _may_wait_on_worker(batcher: DynamicBatcher) -> bool:
    """Whether the next request may queue behind a running batch on its worker: only one
    with no deadline or queue timeout (those are kept in the router's queue, and a BLS call
    to its own busy instance must time out there instead of waiting on itself)."""
    head = batcher.head()
    return head is not None and not head.expires_ns()
