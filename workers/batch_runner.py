"""A worker's batches: an ``ExecBatch`` run on its instance (short ones on the main thread,
the rest on the instance's thread), its outputs written into the arena, and what its
outcome sends: each request's ``InferResponse`` straight to its ingress, the
``BatchResult`` to the router. Also the streams of the requests a request backend runs
(one per request: its cancel flag, a decoupled model's responses).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import cast

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status
from conveyor.workers.backends.base import (
    AnsweredLater,
    Backend,
    ParameterizedOutputs,
    RequestBackend,
    RequestOutcome,
)
from conveyor.workers.batch_io import (
    OutputWriter,
    PlannedOutput,
    TensorViews,
    gather_inputs,
    gather_requests,
    host_inputs,
    plan_batch_outputs,
    plan_request_outputs,
)
from conveyor.workers.client_regions import ClientRegionMaps
from conveyor.workers.instances import InstanceKey, LoadedInstance
from conveyor.workers.item_stream import ItemStream

log = logging.getLogger("conveyor.workers.worker")  # the name the worker's log lines always had

EXEC_ALPHA = 0.2  # weight of a batch's time in its instance's recent average
# Sends each (destination, payload): "" is the router, else an ingress endpoint.
SendAll = Callable[[list[tuple[str, bytes]]], None]


class BatchRunner:
    def __init__(self, views: TensorViews, writer: OutputWriter, client_regions: ClientRegionMaps,
                 post_all: SendAll, emit_all: SendAll) -> None:
        """``post_all`` sends from any thread (through the main loop); ``emit_all`` from the
        main thread, into its turn's outboxes."""
        self.views = views
        self.writer = writer
        self.client_regions = client_regions
        self._post_all = post_all
        self._emit_all = emit_all
        # (batch, index) -> the stream of each request a request backend is running
        # or, decoupled, has not ended yet. Instance threads remove their own entries.
        self.streams: dict[tuple[int, int], tuple[InstanceKey, ItemStream]] = {}

    def run(self, inst: LoadedInstance | None, msg: m.ExecBatch) -> None:
        """Run ``msg`` on ``inst`` (None: not loaded here); its answers leave when it is done."""
        if inst is None or inst.backend is None:
            err = m.ErrorInfo(int(Status.UNAVAILABLE), f"model '{msg.model}' is not loaded on this worker")
            self._emit_all(answers(msg, m.BatchResult(msg.batch, [], error=err)))
            return
        if msg.regions:
            self.client_regions.announce(msg.regions)
        streams: list[ItemStream] = []
        if inst.per_request:  # ``_stream`` for each request, inlined: once per request on the hot path
            register, key, plan, writer, post, forget = self.streams, inst.key, inst.plan, self.writer, \
                self._post_all, self._forget_stream
            hold = not inst.decoupled  # an answer sent after execute must follow the batch's result (AnsweredLater)
            for i in range(len(msg.items)):
                stream = ItemStream(msg, i, plan, writer, post, forget, hold)
                register[stream.key] = (key, stream)
                streams.append(stream)
        if inst.runs_inline(msg):
            # Its answers leave with the rest of this turn's (one send per peer: each send wakes
            # libzmq's I/O thread, and a send per batch measured 25% less throughput at c=16).
            self._emit_all(answers(msg, self._run_batch(inst, msg, streams), inst.decoupled))
            _release(streams)
        else:
            def run() -> None:
                self._post_all(answers(msg, self._run_batch(inst, msg, streams), inst.decoupled))
                _release(streams)

            inst.submit(run)

    # --- the requests' streams ------------------------------------------------------------

    def cancel(self, batch: int, index: int) -> None:
        entry = self.streams.get((batch, index))
        if entry is not None:
            entry[1].cancel()

    def fail_streams(self, key: InstanceKey, error: ConveyorError) -> None:
        """End the open requests of instance ``key`` with ``error`` (it is being unloaded)."""
        for owner, stream in list(self.streams.values()):
            if owner == key:
                stream.fail(error)

    def close_streams(self) -> None:
        """End every open request without a word (the router that knew them is gone)."""
        for _, stream in list(self.streams.values()):
            stream.close()

    def _forget_stream(self, stream: ItemStream) -> None:
        self.streams.pop(stream.key, None)

    # --- runs on the instance's thread (or inline) ------------------------------------------

    def _run_batch(self, inst: LoadedInstance, msg: m.ExecBatch, streams: list[ItemStream]) -> m.BatchResult:
        """Run one batch; its ``BatchResult``."""
        backend = inst.backend
        assert backend is not None
        sequences = inst.sequences
        t0 = time.monotonic_ns()
        padded: list[int] | None = None  # the items' rows in a padded sequence batch (ExecBatch.pad_to)
        planned: Sequence[list[PlannedOutput] | ConveyorError]
        try:
            if inst.per_request:
                requests = gather_requests(msg.items, self.views, inst.plan)
                for request, stream in zip(requests, streams, strict=True):
                    request.channel = stream
                run = requests
                if sequences is not None:
                    sequences.add_request_inputs(requests, msg.items)
                    if msg.pad_to and not inst.decoupled:
                        grown = sequences.pad_requests(requests, msg.items, msg.pad_to)
                        if grown is not None:
                            run, padded = grown
                t1 = time.monotonic_ns()
                outcomes = cast(RequestBackend, backend).execute_requests(run)
                if padded is not None:
                    outcomes = [outcomes[row] for row in padded]  # the not-ready requests' answers go nowhere
                t2 = time.monotonic_ns()
                if sequences is not None:
                    sequences.keep_request_states(msg.items, outcomes)
                # Decoupled: the requests were answered (or will be) through their streams.
                planned = [] if inst.decoupled else plan_request_outputs(msg.items, outcomes, inst.plan)
            else:
                inputs, rows = gather_inputs(msg.items, self.views, inst.plan, inst.layout)
                if msg.regions and not getattr(backend, "accepts_device_arrays", False):
                    inputs = host_inputs(inputs)
                wanted = inst.plan.wanted(msg.items)
                if sequences is not None:
                    if msg.pad_to:
                        padded = sequences.pad_batch(inputs, msg.items, msg.pad_to)
                    sequences.add_batch_inputs(inputs, msg.items, padded, msg.pad_to)
                    wanted = sequences.wanted(wanted)
                t1 = time.monotonic_ns()
                outputs = cast(Backend, backend).execute(inputs, wanted)
                t2 = time.monotonic_ns()
                if sequences is not None:
                    if padded is not None:
                        outputs = sequences.unpad(outputs, padded, msg.pad_to)
                    sequences.keep_batch_states(msg.items, outputs)
                planned = plan_batch_outputs(msg.items, rows, outputs, inst.plan, inst.layout)
            results = self.writer.write(planned) if planned else []
            if inst.per_request and results:
                finish_request_results(results, outcomes)
            t3 = time.monotonic_ns()
            reply = m.BatchResult(msg.batch, results, t1 - t0, t2 - t1, t3 - t2)
            if padded is not None:
                reply.padded = msg.pad_to - len(padded)
            for item in msg.items:
                if item.traced:  # wall-clock stamps, comparable across processes
                    wall = time.time_ns() - time.monotonic_ns()
                    reply.trace_ns = [t0 + wall, t1 + wall, t2 + wall, t3 + wall]
                    break
        except ConveyorError as exc:
            reply = m.BatchResult(msg.batch, [], error=m.ErrorInfo(int(exc.status), exc.message))
        except Exception as exc:
            log.exception("batch %d of '%s' failed", msg.batch, msg.model)
            reply = m.BatchResult(msg.batch, [], error=m.ErrorInfo(int(Status.INTERNAL), f"{exc}"))
        for i, stream in enumerate(streams):
            # A decoupled request stays open past execute, unless the batch failed
            # (the router ends its open requests with the batch's error); so does a
            # request its model answers later (AnsweredLater).
            if reply.error is not None or not (inst.decoupled or reply.items[i].pending):
                stream.close()
        took = time.monotonic_ns() - t0
        inst.exec_ns = took if not inst.batches else inst.exec_ns + EXEC_ALPHA * (took - inst.exec_ns)
        inst.batches += 1
        return reply


def answers(msg: m.ExecBatch, result: m.BatchResult, decoupled: bool = False) -> list[tuple[str, bytes]]:
    """What a batch's outcome sends: the ``InferResponse`` of each request the router marked
    ``reply_to``, straight to its ingress, then the ``BatchResult`` to the router, which only
    counts those requests (their outputs and release flags went with the response).

    A decoupled model's requests were answered by their streams; if its batch failed as a
    whole, the router ends them (it knows which are still open)."""
    if decoupled:
        return [("", m.encode(result))]
    out: list[tuple[str, bytes]] = []
    items = result.items
    for i, item in enumerate(msg.items):
        if not item.reply_to:
            continue
        if i < len(items):
            r = items[i]
            if r.pending:
                continue  # its stream answers it when the model does
            resp = m.InferResponse(item.id, msg.model, msg.version, r.outputs, r.error, r.release, True,
                                   r.parameters, msg.generation)
            items[i] = m.ItemResult(r.id, error=r.error)
        else:  # the batch failed as a whole
            error = result.error or m.ErrorInfo(int(Status.INTERNAL), "the batch returned no result for this request")
            resp = m.InferResponse(item.id, msg.model, msg.version, error=error, generation=msg.generation)
        out.append((item.reply_to, m.encode(resp)))
    out.append(("", m.encode(result)))
    return out


def _release(streams: list[ItemStream]) -> None:
    for stream in streams:
        if stream.holding:
            stream.release()


def finish_request_results(results: list[m.ItemResult], outcomes: list[RequestOutcome]) -> None:
    """Each successful request's response parameters (a Python model's ``InferenceResponse(parameters=...)``)
    into its result, and the requests whose model answers them after execute (``AnsweredLater``) marked
    pending: nothing was written for them, and the router keeps them open until their stream's response.
    One pass; plain outputs cost a type check."""
    for i, outcome in enumerate(outcomes):
        kind = type(outcome)
        if kind is dict:
            continue
        if kind is ParameterizedOutputs:
            result = results[i]
            if result.error is None:
                result.parameters = outcome.parameters  # type: ignore[union-attr]
        elif isinstance(outcome, AnsweredLater):
            results[i] = m.ItemResult(results[i].id, pending=True)
