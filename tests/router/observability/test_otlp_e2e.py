"""OpenTelemetry trace mode on a real process group: tritonclient requests (HTTP and gRPC)
become one trace each at an OTLP/HTTP receiver on loopback, with the spans of the ingress,
the router and the worker linked under the caller's ``traceparent``; a collector that is
down costs no request anything."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conveyor.deploy.example_repo import add_sub
from conveyor.deploy.runtime.procs import actor_role, children
from tests.support.group import Server, start_server
from tests.support.metrics import metrics_text
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan

LEVEL = "e2e"

HTTP_TRACE, GRPC_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736", "5bf92f3577b34da6a3ce929d0e0e4737"


def traceparent(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    rx = OtlpReceiver()
    yield rx
    rx.stop()


@pytest.fixture(scope="module")
def otel_server(tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("otel_models"))
    add_sub(repo, "simple_nobatch", 0)
    config = ["mode=opentelemetry", "rate=1", "level=TIMESTAMPS", f"opentelemetry,url={receiver.url}",
              "opentelemetry,resource=deployment.environment=e2e", "opentelemetry,bsp_schedule_delay=50"]
    srv = start_server(repo, f"ot{os.getpid()}", "--workers", "1",
                       *[x for item in config for x in ("--trace-config", item)])
    yield srv
    assert srv.stop() == 0
    assert srv.shm_segments() == []


def operands() -> np.ndarray:
    return np.arange(16, dtype=np.int32)


def http_infer(server: Server, headers: dict[str, str] | None = None, request_id: str = "") -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput("INPUT0", [16], "INT32"), httpclient.InferInput("INPUT1", [16], "INT32")]
    for i in inputs:
        i.set_data_from_numpy(operands())
    result = client.infer("simple_nobatch", inputs, headers=headers, request_id=request_id)
    assert np.array_equal(result.as_numpy("OUTPUT0"), operands() * 2)
    client.close()


def grpc_infer(server: Server, headers: dict[str, str], request_id: str) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [grpcclient.InferInput("INPUT0", [16], "INT32"), grpcclient.InferInput("INPUT1", [16], "INT32")]
    for i in inputs:
        i.set_data_from_numpy(operands())
    result = client.infer("simple_nobatch", inputs, headers=headers, request_id=request_id)
    assert np.array_equal(result.as_numpy("OUTPUT0"), operands() * 2)
    client.close()


def one_trace(receiver: OtlpReceiver, request_id: str) -> dict[str, ReceivedSpan]:
    """The spans of the trace whose router span carries ``request_id``, by actor."""

    def spans() -> list[ReceivedSpan]:
        models = [s for s in receiver.spans if s.attributes.get("triton.request_id") == request_id]
        return receiver.trace(models[0].span.trace_id) if models else []

    receiver.wait_for(lambda: len(spans()) == 3)
    return {s.attributes["conveyor.actor"]: s for s in spans()}


def check_trace(server: Server, trace: dict[str, ReceivedSpan], caller: str, ingress_role: str) -> None:
    root, model, compute = trace["ingress"], trace["router"], trace["worker"]
    caller_trace, caller_span = caller.split("-")[1:3]
    assert {s.span.trace_id.hex() for s in trace.values()} == {caller_trace}
    assert root.span.parent_span_id.hex() == caller_span
    assert model.span.parent_span_id == root.span.span_id and compute.span.parent_span_id == model.span.span_id
    assert (root.span.name, model.span.name, compute.span.name) == ("InferRequest", "simple_nobatch", "compute")
    assert model.attributes["triton.model_name"] == "simple_nobatch" and model.attributes["triton.model_version"] == 1
    # Each span's timestamps come from its own process, and the three nest in time.
    s = [root.span, model.span, compute.span]
    assert s[0].start_time_unix_nano <= s[1].start_time_unix_nano <= s[2].start_time_unix_nano
    assert s[2].end_time_unix_nano <= s[1].end_time_unix_nano <= s[0].end_time_unix_nano
    for span in s:
        times = [e.time_unix_nano for e in span.events]
        assert times == sorted(times) and span.start_time_unix_nano <= span.end_time_unix_nano
    assert [e.name for e in compute.span.events] == [
        "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    roles = {pid: actor_role(argv) for pid, argv in children(server.proc.pid).items()}
    assert roles[root.attributes["conveyor.pid"]] == ingress_role
    assert roles[model.attributes["conveyor.pid"]] == "router"
    assert roles[compute.attributes["conveyor.pid"]] == "worker"
    assert root.resource == {"service.name": "triton-inference-server", "deployment.environment": "e2e"}


def test_http_request_is_one_trace_under_the_callers_span(otel_server: Server, receiver: OtlpReceiver) -> None:
    caller = traceparent(HTTP_TRACE, "00f067aa0ba902b7")
    http_infer(otel_server, {"traceparent": caller}, request_id="http-1")
    check_trace(otel_server, one_trace(receiver, "http-1"), caller, "ingress-http")


def test_grpc_request_is_one_trace_under_the_callers_span(otel_server: Server, receiver: OtlpReceiver) -> None:
    caller = traceparent(GRPC_TRACE, "53995c3f42cd8ad8")
    grpc_infer(otel_server, {"traceparent": caller}, request_id="grpc-1")
    check_trace(otel_server, one_trace(receiver, "grpc-1"), caller, "ingress-grpc")


def test_without_traceparent_a_trace_of_its_own(otel_server: Server, receiver: OtlpReceiver) -> None:
    http_infer(otel_server, request_id="fresh")
    trace = one_trace(receiver, "fresh")
    assert trace["ingress"].span.trace_id.hex() not in (HTTP_TRACE, GRPC_TRACE)
    assert trace["ingress"].span.parent_span_id == b""


def test_trace_setting_shows_the_mode_and_the_exporter(otel_server: Server, receiver: OtlpReceiver) -> None:
    client = httpclient.InferenceServerClient(otel_server.http_url)
    settings = client.get_trace_settings()
    assert settings["trace_mode"] == "opentelemetry" and settings["url"] == f"http://{receiver.url}"
    assert "deployment.environment=e2e" in settings["resource"] and "trace_file" not in settings
    with pytest.raises(Exception, match="set at start"):
        client.update_trace_settings(settings={"trace_mode": "triton"})
    grpc = grpcclient.InferenceServerClient(otel_server.grpc_url)
    assert grpc.get_trace_settings(as_json=True)["settings"]["trace_mode"]["value"] == ["opentelemetry"]
    client.close()
    grpc.close()


def failed_spans(server: Server) -> float:
    for line in metrics_text(server).splitlines():
        if line.startswith("conveyor_trace_spans_failed_total "):
            return float(line.split()[1])
    raise AssertionError("no conveyor_trace_spans_failed_total")


def test_collector_down_costs_no_request(otel_server: Server, receiver: OtlpReceiver) -> None:
    """Last in this module: the receiver goes away for good."""
    receiver.stop()
    for i in range(10):
        http_infer(otel_server, {"traceparent": traceparent(HTTP_TRACE, "00f067aa0ba902b7")}, request_id=f"d{i}")
        grpc_infer(otel_server, {"traceparent": traceparent(GRPC_TRACE, "53995c3f42cd8ad8")}, request_id=f"g{i}")
    receiver.wait_for(lambda: failed_spans(otel_server) >= 60)  # 20 requests, 3 spans each
