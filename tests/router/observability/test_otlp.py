"""OpenTelemetry trace mode without a server: Triton's --trace-config syntax, the trace
extension's view of it, sampling of propagated contexts, and the OTLP exporter against
a real HTTP receiver on loopback (and against none)."""

from __future__ import annotations

import logging
import sys
import time

import pytest

from conveyor.deploy.ports import free_port
from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError
from conveyor.router.observability.otel_options import OtelOptions
from conveyor.router.observability.otlp_export import OtlpExporter
from conveyor.router.observability.trace_context import parse_traceparent
from conveyor.router.observability.trace_settings import TraceSettings, TraceSettingsStore, parse_trace_config
from conveyor.router.observability.tracing import Tracer, TraceRecord
from tests.support.otlp_receiver import OtlpReceiver

LEVEL = "unit"

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(autouse=True)
def no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_SCHEDULE_DELAY",
                 "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)


def test_trace_config_takes_tritons_opentelemetry_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_trace_config([
        "mode=opentelemetry", "rate=1", "level=TIMESTAMPS", "opentelemetry,url=collector:4318/v1/traces",
        "opentelemetry,resource=service.name=svc", "opentelemetry,resource=deployment.environment=a,b",
        "opentelemetry,bsp_schedule_delay=100", "triton,file=/tmp/ignored.json",
    ])
    assert config.opentelemetry and config.settings.trace_rate == 1
    assert config.otel.url == "http://collector:4318/v1/traces"
    assert dict(config.otel.resource) == {"service.name": "svc", "deployment.environment": "a,b"}
    assert config.otel.schedule_delay_ms == 100 and config.otel.max_queue_size == 2048
    assert not parse_trace_config(["rate=5"]).opentelemetry  # Triton's default mode
    assert parse_trace_config([]).otel.url == "http://localhost:4318/v1/traces"
    assert dict(parse_trace_config([]).otel.resource) == {"service.name": "triton-inference-server"}
    for wrong in ("mode=jaeger", "opentelemetry,colour=red", "opentelemetry,resource=novalue",
                  "opentelemetry,bsp_max_export_batch_size=4096", "opentelemetry,bsp_schedule_delay=-1",
                  "triton,mode=opentelemetry"):
        with pytest.raises(ValueError):
            parse_trace_config([wrong])
    # The standard variables apply where the flag says nothing.
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=ml,service.name=from-env")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "250")
    env = parse_trace_config(["opentelemetry,resource=service.name=flag"]).otel
    assert dict(env.resource) == {"service.name": "flag", "team": "ml"} and env.schedule_delay_ms == 250


def test_trace_extension_shows_the_mode_and_keeps_it_fixed() -> None:
    otel = OtelOptions(url="http://c:4318/v1/traces", resource=(("service.name", "s"),))
    store = TraceSettingsStore(TraceSettings(trace_level=("TIMESTAMPS",)), "opentelemetry", otel)
    doc = store.wire()
    assert doc["trace_mode"] == "opentelemetry" and doc["url"] == "http://c:4318/v1/traces"
    assert doc["resource"] == ["service.name=s"] and doc["bsp_schedule_delay"] == "5000"
    assert "trace_file" not in doc and "log_frequency" not in doc  # as Triton: not this mode's settings
    store.update("", dict(doc, trace_rate="0"))  # a GET posted back, one value changed: fine
    assert store.wire()["trace_rate"] == "0"
    for change in ({"trace_mode": "triton"}, {"url": "elsewhere:4318"}, {"bsp_max_queue_size": "1"}):
        with pytest.raises(ConveyorError, match="set at start"):
            store.update("", change)
    triton = TraceSettingsStore(TraceSettings()).wire()
    assert triton["trace_mode"] == "triton" and "trace_file" in triton and "url" not in triton


class ListSink:
    def __init__(self) -> None:
        self.records: list[TraceRecord] = []

    def add(self, record: TraceRecord) -> None:
        self.records.append(record)

    def stats(self) -> dict[str, int] | None:
        return None

    def close(self) -> None:
        pass


def test_a_propagated_context_is_traced_whatever_the_rate() -> None:
    store = TraceSettingsStore(TraceSettings(trace_level=("TIMESTAMPS",), trace_rate=0, trace_count=0),
                               "opentelemetry")
    assert store.any_on  # ingress processes stamp requests: the router picks the propagated ones
    tracer = Tracer(store, ListSink())
    assert tracer.sample("m", "1", m.TraceContext(1, PARENT)) is not None
    assert tracer.sample("m", "1", m.TraceContext(1, "")) is None
    assert tracer.sample("m", "1", m.TraceContext(1, "00-" + "0" * 32 + "-b7ad6b7169203331-01")) is None
    triton = Tracer(TraceSettingsStore(TraceSettings(trace_level=("TIMESTAMPS",), trace_rate=1000)), ListSink())
    assert triton.sample("m", "1", m.TraceContext(1, PARENT)) is None  # Triton mode: only the rate decides


def test_traceparent() -> None:
    trace_id, span_id = parse_traceparent(PARENT) or (b"", b"")
    assert trace_id.hex() == "0af7651916cd43dd8448eb211c80319c" and span_id.hex() == "b7ad6b7169203331"
    for bad in ("", "garbage", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", PARENT + "-extra"):
        assert parse_traceparent(bad) is None
    assert parse_traceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later") is not None


def finished_record(trace_id: int, traceparent: str = "", error: str = "", compute: bool = True) -> TraceRecord:
    record = TraceRecord(trace_id, "add_sub", "1", traceparent, "", 0, request_id="req-7", ingress_pid=11,
                         worker_pid=33, error=error)
    names = ["INGRESS_RECV", "REQUEST_START", "QUEUE_START", "DISPATCH"]
    if compute:
        names += ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    names += ["REQUEST_END", "INGRESS_SEND"]
    for i, name in enumerate(names):
        record.stamp(name, 1_700_000_000_000_000_000 + i * 1000)
    return record


def test_exporter_sends_one_linked_trace_per_request() -> None:
    receiver = OtlpReceiver()
    options = OtelOptions(url=f"http://{receiver.url}", resource=(("service.name", "unit"),), schedule_delay_ms=50)
    exporter = OtlpExporter(options)
    try:
        exporter.add(finished_record(1, PARENT))
        exporter.add(finished_record(2, error="the model failed", compute=False))
        receiver.wait_for(lambda: len(receiver.spans) == 5)
    finally:
        exporter.close()
        receiver.stop()
    assert exporter.stats() == {"exported": 5, "dropped": 0, "failed": 0}
    caller = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
    spans = {s.span.name: s for s in receiver.trace(caller)}
    root, model, compute = spans["InferRequest"], spans["add_sub"], spans["compute"]
    assert root.span.parent_span_id == bytes.fromhex("b7ad6b7169203331")  # the caller's span
    assert model.span.parent_span_id == root.span.span_id and compute.span.parent_span_id == model.span.span_id
    assert root.resource == {"service.name": "unit"} and root.content_type == "application/x-protobuf"
    assert model.attributes["triton.model_name"] == "add_sub" and model.attributes["triton.model_version"] == 1
    assert model.attributes["triton.request_id"] == "req-7"
    assert [root.attributes["conveyor.pid"], compute.attributes["conveyor.pid"]] == [11, 33]
    assert [e.name for e in compute.span.events] == [
        "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    failed = [s for s in receiver.spans if s.span.trace_id != caller]
    assert sorted(s.span.name for s in failed) == ["InferRequest", "add_sub"]  # it never reached compute
    assert all(s.span.status.message == "the model failed" for s in failed)


def test_exporter_drops_when_full_and_survives_a_dead_collector(caplog: pytest.LogCaptureFixture) -> None:
    # A batch larger than the queue, a long delay: nothing leaves before close, so what is dropped is exact.
    options = OtelOptions(url=f"http://127.0.0.1:{free_port()}/v1/traces", max_queue_size=6,
                          max_export_batch_size=512, schedule_delay_ms=60_000)
    exporter = OtlpExporter(options)
    start = time.monotonic()
    for i in range(5):
        exporter.add(finished_record(i))
    assert time.monotonic() - start < 0.5  # never waits for the exporter
    with caplog.at_level(logging.WARNING, logger="conveyor.router.observability.otlp_export"):
        exporter.close()  # the last batch goes out (and fails: nothing listens)
    assert exporter.stats() == {"exported": 0, "dropped": 9, "failed": 6}
    assert len([r for r in caplog.records if "OTLP trace export" in r.getMessage()]) == 1


def test_serve_says_when_the_otel_extra_is_missing(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from conveyor.deploy.cli import main

    monkeypatch.setitem(sys.modules, "opentelemetry.proto.collector.trace.v1.trace_service_pb2", None)  # not installed
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--trace-config", "mode=opentelemetry"])
    assert exited.value.code == 2
    assert "pip install 'conveyor[otel]'" in capsys.readouterr().err
