"""A finished trace as OpenTelemetry spans (OTLP protobuf), one trace per request.

The router holds every timestamp of a traced request (the ingress's arrive in the
request and in ``TraceEnd``, the worker's in ``BatchResult``), so it builds the
spans of all three actors at once, with Triton's shape:

    InferRequest (ingress: INGRESS_RECV .. INGRESS_SEND)       child of the caller's traceparent
      <model>    (router: REQUEST_START, QUEUE_START, DISPATCH .. REQUEST_END)
        compute  (worker: COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END)

Each span names its process (``conveyor.actor``, ``conveyor.pid``). Needs the
``otel`` extra (``opentelemetry-proto``); imported only in OpenTelemetry mode.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from conveyor.router.trace_context import parse_traceparent
from conveyor.router.tracing import TraceRecord

SCOPE = InstrumentationScope(name="conveyor")
MODEL_EVENTS = ("REQUEST_START", "QUEUE_START", "DISPATCH", "REQUEST_END")
COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def _value(value: str | int) -> AnyValue:
    return AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)


def _attributes(pairs: Iterable[tuple[str, str | int]]) -> list[KeyValue]:
    return [KeyValue(key=k, value=_value(v)) for k, v in pairs]


def _span(trace_id: bytes, parent: bytes, name: str, kind: Span.SpanKind.ValueType, stamps: dict[str, int],
          events: Iterable[str], start: str, end: str, attributes: list[tuple[str, str | int]],
          error: str = "") -> Span:
    span = Span(
        trace_id=trace_id, span_id=os.urandom(8), parent_span_id=parent, name=name, kind=kind,
        start_time_unix_nano=stamps[start], end_time_unix_nano=stamps[end],
        attributes=_attributes(attributes),
        events=[Span.Event(time_unix_nano=stamps[e], name=e) for e in events if e in stamps],
    )
    if error:
        span.status.CopyFrom(Status(code=Status.STATUS_CODE_ERROR, message=error))
    return span


def trace_spans(record: TraceRecord, router_pid: int) -> list[Span]:
    """The spans of one finished trace: root, model and (when the worker ran it) compute."""
    stamps = dict(record.timestamps)
    caller = parse_traceparent(record.traceparent)
    trace_id, parent = caller if caller is not None else (os.urandom(16), b"")
    root = _span(trace_id, parent, "InferRequest", Span.SPAN_KIND_SERVER, stamps, ("INGRESS_RECV", "INGRESS_SEND"),
                 "INGRESS_RECV", "INGRESS_SEND", [("conveyor.actor", "ingress"), ("conveyor.pid", record.ingress_pid)],
                 record.error)
    model_attributes: list[tuple[str, str | int]] = [
        ("triton.model_name", record.model), ("triton.model_version", int(record.version)),
        ("triton.trace_id", record.id), ("conveyor.actor", "router"), ("conveyor.pid", router_pid),
    ]
    if record.request_id:
        model_attributes.append(("triton.request_id", record.request_id))
    model = _span(trace_id, root.span_id, record.model, Span.SPAN_KIND_INTERNAL, stamps, MODEL_EVENTS,
                  "REQUEST_START", "REQUEST_END", model_attributes, record.error)
    spans = [root, model]
    if "COMPUTE_START" in stamps and "COMPUTE_END" in stamps:
        spans.append(_span(trace_id, model.span_id, "compute", Span.SPAN_KIND_INTERNAL, stamps, COMPUTE_EVENTS,
                           "COMPUTE_START", "COMPUTE_END",
                           [("conveyor.actor", "worker"), ("conveyor.pid", record.worker_pid)]))
    return spans


def export_request(records: Iterable[TraceRecord], resource: Iterable[tuple[str, str]]) -> bytes:
    """One OTLP/HTTP request body (``application/x-protobuf``) for these traces."""
    pid = os.getpid()
    spans = [span for record in records for span in trace_spans(record, pid)]
    message = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=_attributes(resource)),
        scope_spans=[ScopeSpans(scope=SCOPE, spans=spans)],
    )])
    return message.SerializeToString()
