"""A tiny OTLP/HTTP trace receiver on loopback: decodes ``ExportTraceServiceRequest`` bodies
as a collector would, and keeps every span with its resource attributes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def attributes(pairs: Any) -> dict[str, Any]:
    """OTLP ``KeyValue``s as a dict (string and int values)."""
    out: dict[str, Any] = {}
    for kv in pairs:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


@dataclass
class ReceivedSpan:
    span: Any  # opentelemetry.proto.trace.v1.trace_pb2.Span
    resource: dict[str, Any]
    content_type: str

    @property
    def attributes(self) -> dict[str, Any]:
        return attributes(self.span.attributes)


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                message = ExportTraceServiceRequest.FromString(body)
                content_type = self.headers.get("Content-Type", "")
                with receiver._lock:
                    receiver.requests += int(self.path == "/v1/traces")
                    for rs in message.resource_spans:
                        resource = attributes(rs.resource.attributes)
                        for ss in rs.scope_spans:
                            receiver.spans += [ReceivedSpan(s, resource, content_type) for s in ss.spans]
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """As Triton's ``--trace-config opentelemetry,url=`` takes it: no scheme."""
        return f"127.0.0.1:{self.port}/v1/traces"

    def trace(self, trace_id: bytes) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.span.trace_id == trace_id]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "the receiver did not get the spans in time"
            time.sleep(0.05)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
