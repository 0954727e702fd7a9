"""Request traces: sampling in the router, timestamps from all three actors, the trace file.

An ingress marks requests with a ``TraceContext`` (received time, traceparent)
only while some tracing is on; the router samples every ``trace_rate``-th of
them per model, stamps queueing and dispatch, asks the worker for the compute
stamps (``BatchItem.traced``), and the ingress sends ``TraceEnd`` when it
answers. Complete traces go to a background thread, so the router loop never
waits on the disk or the network: written as Triton's trace-file JSON (mode
``triton``) or exported as OpenTelemetry spans (mode ``opentelemetry``,
``router/observability/otlp_export.py``). Untraced requests cost one ``is None`` test.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from conveyor.proto import messages as m
from conveyor.router.observability.trace_context import parse_traceparent
from conveyor.router.observability.trace_settings import TraceSettingsStore

log = logging.getLogger(__name__)

# Traces whose ingress never said TraceEnd (it died) are dropped beyond this many.
MAX_OPEN_TRACES = 10_000
WORKER_STAMPS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


@dataclass(slots=True)
class TraceRecord:
    id: int
    model: str
    version: str
    traceparent: str
    file: str
    log_frequency: int
    timestamps: list[tuple[str, int]] = field(default_factory=list)
    request_id: str = ""  # the client's own id
    ingress_pid: int = 0
    worker_pid: int = 0
    error: str = ""  # the request failed: why

    def stamp(self, name: str, ns: int | None = None) -> None:
        self.timestamps.append((name, time.time_ns() if ns is None else ns))

    def wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.id, "model_name": self.model, "model_version": int(self.version),
            "timestamps": [{"name": n, "ns": ns} for n, ns in self.timestamps],
        }
        if self.traceparent:
            doc["traceparent"] = self.traceparent
        return doc

    def span_count(self) -> int:
        """OpenTelemetry spans: the ingress's and the router's, and the worker's when it ran."""
        return 3 if any(name == "COMPUTE_START" for name, _ in self.timestamps) else 2


class TraceSink(Protocol):
    """Where finished traces go, off the router loop: the trace file or an OTLP collector."""

    def add(self, record: TraceRecord) -> None: ...

    def stats(self) -> dict[str, int] | None: ...

    def close(self) -> None: ...


class TraceFileWriter:
    """Buffers finished traces per file; writes a JSON array every ``log_frequency`` traces
    (to ``<file>.<n>``, as Triton) or, with 0, once at close (to ``<file>``)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[str, list[dict[str, Any]]] | None] = queue.SimpleQueue()
        self._buffers: dict[str, list[dict[str, Any]]] = {}
        self._index: dict[str, int] = {}
        self._thread = threading.Thread(target=self._write_forever, name="trace-writer", daemon=True)
        self._thread.start()

    def add(self, record: TraceRecord) -> None:
        if not record.file:
            return
        buf = self._buffers.setdefault(record.file, [])
        buf.append(record.wire())
        if record.log_frequency and len(buf) >= record.log_frequency:
            n = self._index.get(record.file, 0)
            self._index[record.file] = n + 1
            self._jobs.put((f"{record.file}.{n}", self._buffers.pop(record.file)))

    def stats(self) -> dict[str, int] | None:
        return None  # nothing to count: the file is written or the error logged

    def close(self) -> None:
        for path, buf in self._buffers.items():
            n = self._index.get(path)
            self._jobs.put((path if n is None else f"{path}.{n}", buf))
        self._buffers.clear()
        self._jobs.put(None)
        self._thread.join(timeout=10)

    def _write_forever(self) -> None:
        while (job := self._jobs.get()) is not None:
            path, traces = job
            try:
                # Whole or absent: a reader never sees half a file.
                with open(f"{path}.tmp", "w") as f:
                    json.dump(traces, f, indent=1)
                os.replace(f"{path}.tmp", path)
            except OSError as exc:
                log.error("cannot write the trace file %s: %s", path, exc)


class Tracer:
    def __init__(self, store: TraceSettingsStore, sink: TraceSink | None = None) -> None:
        self.store = store
        self._seen: dict[str, int] = {}
        self._ids = itertools.count(1)
        self.open: OrderedDict[int, TraceRecord] = OrderedDict()
        self.sink: TraceSink = sink or TraceFileWriter()

    def sample(self, model: str, version: str, ctx: m.TraceContext, request_id: str = "",
               ingress_pid: int = 0) -> TraceRecord | None:
        """A record for this request when it is one the settings sample, else None.

        In OpenTelemetry mode a request that carries a valid ``traceparent`` is always
        traced (its caller traces it), whatever the rate and count, as in Triton;
        ``trace_rate`` 0 traces only those."""
        settings = self.store.effective(model)
        forced = (self.store.opentelemetry and settings.trace_level != ("OFF",) and bool(ctx.traceparent)
                  and parse_traceparent(ctx.traceparent) is not None)
        hit = False
        if settings.on and settings.trace_rate:
            seen = self._seen.get(model, 0) + 1
            self._seen[model] = seen
            hit = seen % settings.trace_rate == 0
            if hit:
                self.store.take_count(model)
        if not hit and not forced:
            return None
        record = TraceRecord(next(self._ids), model, version, ctx.traceparent, settings.trace_file,
                             settings.log_frequency, request_id=request_id, ingress_pid=ingress_pid)
        record.stamp("INGRESS_RECV", ctx.received_ns)
        record.stamp("REQUEST_START")
        record.stamp("QUEUE_START")
        return record

    def returned(self, record: TraceRecord, worker_ns: list[int], worker_pid: int = 0, error: str = "") -> None:
        """The worker answered: its compute stamps, then ours; wait for the ingress's TraceEnd."""
        for name, ns in zip(WORKER_STAMPS, worker_ns, strict=False):
            record.stamp(name, ns)
        record.worker_pid, record.error = worker_pid, error
        record.stamp("REQUEST_END")
        self.open[record.id] = record
        while len(self.open) > MAX_OPEN_TRACES:
            self.open.popitem(last=False)

    def finish(self, msg: m.TraceEnd) -> None:
        record = self.open.pop(msg.trace_id, None)
        if record is not None:
            record.stamp("INGRESS_SEND", msg.sent_ns)
            self.sink.add(record)

    def export_stats(self) -> dict[str, int] | None:
        """Spans exported, dropped and failed (OpenTelemetry mode), for ``/metrics``."""
        return self.sink.stats()

    def close(self) -> None:
        self.sink.close()
