"""Where an ``InferRequest`` goes on arrival: refused (unknown model, bad client region,
no batch shape, its model overloaded: ``scheduling/overload.py``), answered from the response
cache, run by the ensemble scheduler, or queued in its version's batcher; and a ``Cancel`` for it."""

from __future__ import annotations

import time
from functools import partial

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError
from conveyor.proto.migration import MIGRATION
from conveyor.proto.request_checks import check_step_inputs
from conveyor.proto.signature import ModelSignature
from conveyor.router.context import RouterContext
from conveyor.router.dispatch import Dispatcher
from conveyor.router.ensembles.scheduler import EnsembleScheduler
from conveyor.router.ensembles.state import EnsembleVersion
from conveyor.router.models import VersionState, signature
from conveyor.router.observability.stats import EnsembleRequestStats
from conveyor.router.pending import Pending
from conveyor.router.replies import count_failure
from conveyor.router.response_cache import cache_key, step_hash
from conveyor.router.shared_memory.client_regions import ClientShmRegistry
from conveyor.shm.regions import RegionCache


class Admission:
    def __init__(
        self, ctx: RouterContext, dispatcher: Dispatcher, shm: ClientShmRegistry,
        ensemble_link: bytes, regions: RegionCache, ingress_pids: dict[bytes, int],
    ) -> None:
        """``ensemble_link``: the identity of the router's own link, under which an ensemble's
        steps come back here (``ensembles/self_link.py``); ``regions``: other processes' arenas;
        ``ingress_pids``: each ingress's pid (``IngressHello``), for traces."""
        self.registry = ctx.registry
        self._queued = ctx.ledger.queued
        self.ledger = ctx.ledger
        self.cache = ctx.cache
        self.loans = ctx.loans
        self.tracer = ctx.tracer
        self.replies = ctx.replies
        self._reply_error = ctx.replies.error
        self.shm = shm
        self.dispatcher = dispatcher
        self._schedule = dispatcher.schedule
        self.ingress_pids = ingress_pids
        self._regions = regions
        registry = ctx.registry
        self.ensembles = EnsembleScheduler(
            partial(self.on_infer, ensemble_link), partial(self.cancel, ensemble_link), ctx.replies.send,
            ctx.holds, ctx.loans, lambda: registry.generation, regions, ctx.cache,
        )
        shm.in_use = self.regions_in_use

    def regions_in_use(self) -> set[int]:
        """The client registrations that requests queued (in a dynamic batcher) or running use.
        Asked only while an unregistered region waits for its requests: not on the hot path."""
        used: set[int] = set()
        for p in self.ledger.running_requests():
            used.update(r.id for r in p.request.regions)
        for state in self.ledger.queued_versions():
            queues = getattr(state.batcher, "queues", None)  # a sequence batcher's requests are not seen
            if queues is not None:
                for p in queues.in_order():
                    used.update(r.id for r in p.request.regions)
        return used

    def on_infer(self, identity: bytes, req: m.InferRequest,
                 ensemble_stats: EnsembleRequestStats | None = None) -> None:
        try:
            state = self.registry.resolve(req.model, req.version)
        except ConveyorError as exc:
            self._reply_error(identity, req.id, req.model, req.version, exc)
            return
        if req.flags & m.FLAG_CLIENT_SHM:
            try:
                self.shm.resolve(req)
            except ConveyorError as exc:
                self._reply_error(identity, req.id, req.model, req.version, exc)
                return
        if not req.outputs:  # a BLS request that names no outputs gets them all, as in Triton
            req.outputs = [m.OutputSpec(o.name) for o in state.config.output]
        if isinstance(state, EnsembleVersion):
            # Triton looks its whole response up first (core's ensemble_scheduler.cc); cached when it ends.
            if req.cache_key and self._answer_from_cache(identity, req, state):
                return
            self.ensembles.start(identity, req, state)
            return
        if ensemble_stats is not None:  # an ensemble's step: checked as a client's request is at its ingress
            try:
                sig = state.step_signature
                if sig is None:
                    sig = state.step_signature = ModelSignature.from_wire(signature(state))
                check_step_inputs(sig, req.inputs, req.request_id)
                if self.cache is not None and state.config.response_cache.enable:  # no cache: one test
                    self._step_cache_key(req)
            except ConveyorError as exc:
                self._reply_error(identity, req.id, state.model, state.label, exc)
                return
        if req.cache_key and self._answer_from_cache(identity, req, state):
            return
        batched = state.config.max_batch_size > 0
        rows = req.inputs[0].shape[0] if batched and req.inputs and req.inputs[0].shape else 1
        try:
            key = state.batch_key(req)
        except ConveyorError as exc:  # longer than the largest pad bucket
            self._reply_error(identity, req.id, state.model, state.label, exc)
            return
        waiting, limits = state.waiting, state.limits
        if limits.any:  # one test when the model sets no limit
            refused = waiting.refusal(limits, req, state.model)
            if refused is not None:  # overloaded: refused at once, counted as Triton counts a full queue
                count_failure(state, "REJECTED", 0)
                self._reply_error(identity, req.id, state.model, state.label, refused)
                return
        if req.parameters and MIGRATION in req.parameters:  # a request resumed after its worker died
            state.migrations += 1
        pending = Pending(identity, req, time.monotonic_ns(), rows, key)
        if ensemble_stats is not None:
            pending.ensemble_stats = ensemble_stats
        if req.trace is not None:
            pending.trace = self.tracer.sample(state.model, state.label, req.trace, req.request_id,
                                               self.ingress_pids.get(identity, 0))
        try:
            state.batcher.push(pending)
        except ConveyorError as exc:  # queue full
            count_failure(state, "REJECTED", 0)
            self._reply_error(identity, req.id, state.model, state.label, exc)
            return
        waiting.add(pending)
        self._queued(identity, req.id, state)
        self._schedule(state)

    def cancel(self, identity: bytes, request_id: int) -> None:
        """The client went away: drop its request from the queue, tell the worker running
        it, or stop its ensemble run."""
        if not self.dispatcher.cancel(identity, request_id):
            self.ensembles.cancel(identity, request_id)

    def _step_cache_key(self, req: m.InferRequest) -> None:
        """An ensemble's step to a model that caches its responses (Triton looks each step up in its model's
        cache): keyed by ``step_hash``."""
        view = self._regions.view
        req.cache_key = step_hash(req, lambda r: view(r.region, r.offset, r.nbytes))

    def _answer_from_cache(self, identity: bytes, req: m.InferRequest, state: VersionState) -> bool:
        """Answer a cache hit at once (the cached block lent to the ingress). On a miss the
        request runs, keeping its ``cache_key`` so that ``Results`` caches its response."""
        start = time.monotonic_ns()
        cache = self.cache
        if cache is None or not state.config.response_cache.enable:
            req.cache_key = b""
            return False
        entry = cache.get(cache_key(state.model, state.label, req))
        if entry is not None:
            try:
                release = [self.loans.lend(entry.blocks)]
            except ConveyorError:
                entry = None  # no loan left: run it instead
        if entry is None:
            elapsed = time.monotonic_ns() - start
            state.stats.cache_miss.add(elapsed)
            state.latency.cache_looked_up(False, elapsed)
            return False
        elapsed = time.monotonic_ns() - start
        state.stats.record_cache_hit(elapsed, elapsed)
        state.latency.cache_looked_up(True, elapsed)
        self.replies.send(identity, m.InferResponse(
            req.id, state.model, state.label, entry.outputs, release=release, generation=self.registry.generation,
        ))
        return True
