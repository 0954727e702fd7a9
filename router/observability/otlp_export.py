"""Finished traces to an OTLP/HTTP collector, from a thread of the router (a batch span processor).

The router loop only appends a finished trace to a bounded queue; this thread
turns queued traces into spans and POSTs them (protobuf) when a batch is full
or ``bsp_schedule_delay`` has passed. A full queue drops the new trace's spans
and counts them; a collector that is down or slow costs dropped spans, never a
request's latency. Failures are logged at most once per ``REPORT_INTERVAL_S``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from conveyor.router.observability.otel_options import OtelOptions
from conveyor.router.observability.trace_settings import TraceConfig
from conveyor.router.observability.tracing import TraceRecord

log = logging.getLogger(__name__)

EXPORT_TIMEOUT_S = 10.0  # OTEL_EXPORTER_OTLP_TIMEOUT's default
REPORT_INTERVAL_S = 60.0
CLOSE_TIMEOUT_S = 5.0  # what the router's exit waits for the last batch


def otel_missing() -> str:
    """Why OpenTelemetry mode cannot run here, or ''."""
    try:
        import opentelemetry.proto.collector.trace.v1.trace_service_pb2  # noqa: F401
    except ImportError:
        return ("--trace-config mode=opentelemetry needs the OTLP protobuf messages: "
                "pip install 'conveyor[otel]' (opentelemetry-proto)")
    return ""


def otlp_sink(config: TraceConfig) -> OtlpExporter | None:
    """The exporter OpenTelemetry mode needs, or None (mode ``triton``: the trace file)."""
    return OtlpExporter(config.otel) if config.opentelemetry else None


class OtlpExporter:
    """``add`` from the router loop; everything else happens on the exporter's thread."""

    def __init__(self, options: OtelOptions) -> None:
        from conveyor.router.observability.otel_spans import export_request  # needs the otel extra

        self._encode = export_request
        self.options = options
        self._cond = threading.Condition()
        self._queue: deque[TraceRecord] = deque()
        self._queued_spans = 0
        self._closing = False
        self.exported = 0  # spans the collector accepted
        self.dropped = 0  # spans that found the queue full
        self.failed = 0  # spans in exports that failed
        self._reported = {"dropped": 0, "failed": 0}
        self._last_report = 0.0
        self._last_error = ""
        self._thread = threading.Thread(target=self._export_forever, name="otlp-export", daemon=True)
        self._thread.start()

    def add(self, record: TraceRecord) -> None:
        spans = record.span_count()
        with self._cond:
            if self._queued_spans + spans > self.options.max_queue_size:
                self.dropped += spans
                return
            self._queue.append(record)
            self._queued_spans += spans
            if self._queued_spans >= self.options.max_export_batch_size:
                self._cond.notify()

    def stats(self) -> dict[str, int]:
        return {"exported": self.exported, "dropped": self.dropped, "failed": self.failed}

    def close(self) -> None:
        """Send what is queued (bounded in time), then stop."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(CLOSE_TIMEOUT_S)

    def _take_batch(self) -> tuple[list[TraceRecord], bool]:
        with self._cond:
            if not self._closing and self._queued_spans < self.options.max_export_batch_size:
                self._cond.wait(self.options.schedule_delay_ms / 1000)
            batch: list[TraceRecord] = []
            spans = 0
            limit = self.options.max_export_batch_size
            while self._queue and (not batch or spans + self._queue[0].span_count() <= limit):
                record = self._queue.popleft()
                spans += record.span_count()
                batch.append(record)
            self._queued_spans -= spans
            return batch, self._closing and not self._queue

    def _export_forever(self) -> None:
        while True:
            batch, last = self._take_batch()
            if batch:
                self._export(batch)
            self._report()
            if last:
                return

    def _export(self, batch: list[TraceRecord]) -> None:
        # Imported here: urllib.request (http.client, ssl) was a hundredth of a second of every router's start-up,
        # and only an exporter, in OpenTelemetry mode, sends anything.
        import urllib.request

        spans = sum(r.span_count() for r in batch)
        try:
            body = self._encode(batch, self.options.resource)
            request = urllib.request.Request(self.options.url, data=body, method="POST",
                                             headers={"Content-Type": "application/x-protobuf"})
            with urllib.request.urlopen(request, timeout=EXPORT_TIMEOUT_S) as response:
                response.read()
        except Exception as exc:  # whatever the collector or the network did: count it, carry on
            self.failed += spans
            self._last_error = f"{type(exc).__name__}: {exc}"
            return
        self.exported += spans

    def _report(self) -> None:
        """At most one log line per interval, with what went wrong since the last one."""
        now = time.monotonic()
        if now - self._last_report < REPORT_INTERVAL_S and not self._closing:
            return
        dropped = self.dropped - self._reported["dropped"]
        failed = self.failed - self._reported["failed"]
        if not dropped and not failed:
            return
        self._last_report = now
        self._reported = {"dropped": self.dropped, "failed": self.failed}
        log.warning("OTLP trace export to %s: %d span(s) failed to send (last error: %s), %d dropped "
                    "(queue full, bsp_max_queue_size=%d) since the last report", self.options.url, failed,
                    self._last_error or "none", dropped, self.options.max_queue_size)
