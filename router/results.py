"""What workers answer for a batch: ``BatchResult`` (every item at once) and, for a
decoupled model, one ``ItemResponse`` per response; each becomes an ``InferResponse``
to the request's ingress, counted in the version's statistics."""

from __future__ import annotations

import time
from collections.abc import Callable

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError
from conveyor.router.context import RouterContext
from conveyor.router.dispatch import Dispatcher
from conveyor.router.ledger import Running
from conveyor.router.models import VersionState
from conveyor.router.observability.histograms import failure_reason
from conveyor.router.replies import count_failure
from conveyor.router.response_cache import cache_key


class Results:
    def __init__(self, ctx: RouterContext, dispatcher: Dispatcher, settle: Callable[[], None]) -> None:
        """``settle``: the lifecycle's look at retired versions, whose instances may have become idle."""
        self.front = ctx.front
        self.registry = ctx.registry
        self.ledger = ctx.ledger
        self._batch = ctx.ledger.batch
        self._schedule = dispatcher.schedule
        self.pool = ctx.pool
        self.tracer = ctx.tracer
        self.limiter = ctx.limiter
        self.cache = ctx.cache
        self.loans = ctx.loans
        self._settle = settle

    def on_result(self, result: m.BatchResult, from_worker: bool = True) -> None:
        """``from_worker`` False: the router fails the batch itself (its worker is gone), so it
        answers every request, also those the worker would have answered directly."""
        run = self._batch(result.batch)
        if run is None or not run.executing:
            return
        later = False
        if run.open is None and result.error is None:
            for item in result.items:  # a plain loop, no generator: asked for every batch
                if item.pending:
                    later = True
                    break
        if later:
            # A Python model answers these requests after execute returned (its response
            # sender): they stay open, as a decoupled model's do, until that response.
            run.open = [item.pending for item in result.items]
        self.ledger.returned(result.batch, run)
        inst = run.instance
        inst.running = max(0, inst.running - 1)
        if self.limiter is not None:
            self.limiter.release(inst)
        state = inst.version
        stats = state.stats
        if result.error is None:
            rows = 0
            for p in run.items:  # a plain loop: no generator per batch
                rows += p.rows
            stats.record_batch(rows + result.padded, len(run.items), result.input_ns, result.infer_ns,
                               result.output_ns, result.padded)
            state.latency.computed(len(run.items), result.input_ns, result.infer_ns, result.output_ns)
            adaptive = state.batcher.adaptive
            if adaptive is not None:
                adaptive.executed(time.monotonic_ns(), rows)
        if run.open is not None and not later:
            # Decoupled: the items were (or will be) answered by ItemResponses.
            if result.error is not None:
                self.end_open_items(result.batch, run, result.error)
            else:
                for p in run.items:  # an ensemble's decoupled step: its compute times count there too
                    if p.ensemble_stats is not None:
                        p.ensemble_stats.record_composing(result.input_ns, result.infer_ns, result.output_ns)
            self._after_batch(state)
            return
        now = time.monotonic_ns()
        gen = self.registry.generation
        send = self.front.send
        order = state.order
        items = result.items
        answered = len(items)
        success, succeeded = stats.success, state.latency.succeeded
        first = state.latency.first_response  # None unless histograms are on (as Triton, every model's)
        for i, p in enumerate(run.items):
            item = items[i] if i < answered else m.ItemResult(i, error=result.error)
            if item.pending:
                continue  # counted and answered with its response (on_item_response, on_responses_sent)
            error = item.error or result.error
            took = now - p.arrival_ns
            if error is None:
                success.count += 1  # ``Duration.add``, inlined: per request
                success.ns += took
                succeeded(took)
                if first is not None:
                    first.observe(took)
                if p.ensemble_stats is not None:
                    p.ensemble_stats.record_composing(result.input_ns, result.infer_ns, result.output_ns)
            else:
                count_failure(state, failure_reason(error.status), took)
            if p.direct and from_worker:
                continue  # the worker has answered the ingress itself
            release = item.release
            if p.request.cache_key and error is None:
                release = self._cache_response(state, p.request, item)
            resp = m.InferResponse(p.request.id, state.model, state.label, item.outputs, error, release,
                                   parameters=item.parameters, generation=gen)
            if p.trace is not None:
                worker = self.pool.workers.get(inst.worker or b"")
                self.tracer.returned(p.trace, result.trace_ns, worker.pid if worker else 0,
                                     error.message if error else "")
                resp.trace_id = p.trace.id
            if order is None:
                send(p.ingress, m.encode(resp))
            else:
                for identity, payload in order.release(p.ticket, p.ingress, m.encode(resp)):
                    send(identity, payload)
        self._after_batch(state)
        self._settle()

    def on_item_response(self, worker: bytes, msg: m.ItemResponse) -> None:
        """Forward one response of a decoupled model's request (or of a request a Python
        model answered after execute) to its ingress."""
        run = self._batch(msg.batch)
        if (
            run is None or run.open is None or run.instance.worker != worker
            or not 0 <= msg.index < len(run.open) or not run.open[msg.index]
        ):
            return  # a late response for a request already ended (worker dropped, router restarted)
        p = run.items[msg.index]
        state = run.instance.version
        now = time.monotonic_ns()
        state.stats.record_response(p.responses, now - (p.last_response_ns or run.dispatched_ns),
                                    msg.error.status if msg.error else None, bool(msg.outputs or msg.parameters))
        p.responses += 1
        p.last_response_ns = now
        if not p.responded:  # nv_inference_first_response_histogram_ms: a failure is no first response
            p.responded = True
            self.ledger.responded(p, run.instance)
            first = state.latency.first_response
            if first is not None and msg.error is None:
                first.observe(now - p.arrival_ns)
        resp = m.InferResponse(
            p.request.id, state.model, state.label, msg.outputs, msg.error, msg.release, msg.final,
            msg.parameters, self.registry.generation,
        )
        self.front.send(p.ingress, m.encode(resp))
        if msg.final:
            self._close_item(msg.batch, run, msg.index, msg.error)

    def on_responses_sent(self, worker: bytes, msg: m.ItemResponsesSent) -> None:
        """Count the responses a worker sent straight to a decoupled request's ingress."""
        run = self._batch(msg.batch)
        if (
            run is None or run.open is None or run.instance.worker != worker
            or not 0 <= msg.index < len(run.open) or not run.open[msg.index]
        ):
            return  # the request already ended (its worker dropped, the router restarted)
        p = run.items[msg.index]
        state = run.instance.version
        record = state.stats.record_response
        for count in msg.counts:
            status = count.status if count.failed or count.status else None
            record(p.responses, count.took_ns, status, count.has_outputs, count.output_ns)
            p.responses += 1
        now = time.monotonic_ns()
        p.last_response_ns = now
        if not p.responded and msg.counts:
            p.responded = True
            self.ledger.responded(p, run.instance)
            first = state.latency.first_response
            if first is not None and not (msg.counts[0].status or msg.counts[0].failed):
                first.observe(now - p.arrival_ns)
        if msg.final:
            self._close_item(msg.batch, run, msg.index, msg.error)

    def end_open_items(self, bid: int, run: Running, error: m.ErrorInfo) -> None:
        """Answer every decoupled request of ``run`` still open with ``error`` (final)."""
        assert run.open is not None
        for i, is_open in enumerate(run.open):
            if is_open:
                self.on_item_response(run.instance.worker or b"", m.ItemResponse(bid, i, error=error))

    def _after_batch(self, state: VersionState) -> None:
        """An instance of ``state`` is free again: schedule it, and with rate limiting
        every version that waited for the resources it gave back, best turn first."""
        if self.limiter is None:
            self._schedule(state)
            return
        self.limiter.wait(state)
        for waiting in self.limiter.take_waiting():
            self._schedule(waiting)

    def _close_item(self, bid: int, run: Running, index: int, error: m.ErrorInfo | None) -> None:
        """A decoupled request had its final response: count it, forget it."""
        self.ledger.closed(bid, run, index)
        p = run.items[index]
        state = run.instance.version
        took = time.monotonic_ns() - p.arrival_ns
        if error is None:
            state.stats.success.add(took)
            state.latency.succeeded(took)
        else:
            count_failure(state, failure_reason(error.status), took)

    def _cache_response(self, state: VersionState, req: m.InferRequest, item: m.ItemResult) -> list[m.Release]:
        """A cache miss's outputs: keep them in the cache, and lend them to this request's ingress too
        (the worker's own flag now belongs to the cache)."""
        start = time.monotonic_ns()
        assert self.cache is not None
        try:
            loan = self.loans.lend(item.release)
        except ConveyorError:
            return item.release
        self.cache.put(cache_key(state.model, state.label, req), item.outputs, item.release)
        state.stats.cache_miss.add(time.monotonic_ns() - start, 0)  # Triton counts the insertion as miss time
        return [loan]
