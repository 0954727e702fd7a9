"""The triton_python_backend_utils surface models use, in-process: response and
request parameters, the request's Triton arguments, custom metrics' semantics,
the Logger levels and the names the module exports."""

from __future__ import annotations

import gc
import json
import time
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from conveyor.workers.backends.base import outcome_parameters
from conveyor.workers.backends.python import pb_utils
from conveyor.workers.backends.python.pb_utils.inference import bls_parameters, response_outcome
from conveyor.workers.backends.python.pb_utils.metrics import MetricRegistry

LEVEL = "unit"

# What Triton 2.51's module offers that models use; Conveyor's must keep offering it.
TRITON_NAMES = {
    "Tensor", "InferenceRequest", "InferenceResponse", "InferenceResponseSender", "TritonError",
    "TritonModelException", "Logger", "LogLevel", "ModelConfig", "MetricFamily", "Metric", "MetricKind",
    "COUNTER", "GAUGE", "HISTOGRAM", "PreferredMemory", "MemoryType", "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU", "InferenceTrace", "load_model", "unload_model", "is_model_ready",
    "get_input_tensor_by_name", "get_output_tensor_by_name", "get_input_config_by_name",
    "get_output_config_by_name", "triton_string_to_numpy", "triton_to_numpy_type", "numpy_to_triton_type",
    "serialize_byte_tensor", "deserialize_bytes_tensor", "using_decoupled_model_transaction_policy",
    "TRITON_STRING_TO_NUMPY", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
}


def test_the_module_exports_what_triton_models_use() -> None:
    assert TRITON_NAMES <= set(pb_utils.__all__)
    assert all(hasattr(pb_utils, name) for name in pb_utils.__all__)


def test_response_parameters_are_checked_as_triton_checks_them() -> None:
    out = pb_utils.Tensor("OUT", np.arange(3, dtype=np.int32))
    resp = pb_utils.InferenceResponse([out], parameters={"s": "x", "i": 7, "b": True})
    assert json.loads(resp.parameters()) == {"s": "x", "i": 7, "b": True}
    assert json.loads(pb_utils.InferenceResponse([out], parameters='{"j": 1}').parameters()) == {"j": 1}
    assert pb_utils.InferenceResponse([out]).parameters() == "{}"
    with pytest.raises(pb_utils.TritonModelException, match="values to have type bool/int/str"):
        pb_utils.InferenceResponse([out], parameters={"f": 1.5})
    with pytest.raises(pb_utils.TritonModelException, match="keys to have type str"):
        pb_utils.InferenceResponse([out], parameters={1: "x"})  # type: ignore[dict-item]


def test_only_responses_with_parameters_carry_them_to_the_worker() -> None:
    out = pb_utils.Tensor("OUT", np.arange(3, dtype=np.int32))
    plain = response_outcome(pb_utils.InferenceResponse([out]))
    assert type(plain) is dict and outcome_parameters(plain) is None
    rich = response_outcome(pb_utils.InferenceResponse([out], parameters={"n": 1}))
    assert outcome_parameters(rich) == {"n": 1} and list(rich) == ["OUT"]  # type: ignore[arg-type]


def test_inference_request_takes_tritons_arguments() -> None:
    t = pb_utils.Tensor("IN", np.zeros(2, dtype=np.int32))
    req = pb_utils.InferenceRequest(
        "rid", 42, [t], ["OUT"], "m", 3, pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, 1000,
        pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0), pb_utils.InferenceTrace(), {"k": "v"},
    )
    assert (req.request_id(), req.correlation_id(), req.model_name(), req.model_version()) == ("rid", 42, "m", 3)
    assert req.timeout() == 1000 and json.loads(req.parameters()) == {"k": "v"}
    assert req.trace().get_context() is None
    req.set_flags(pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START | pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    assert bls_parameters(req) == {"k": "v", "sequence_id": 42, "sequence_start": True, "sequence_end": True}
    assert pb_utils.InferenceRequest(correlation_id="seq-a", inputs=[t], requested_output_names=[],
                                     model_name="m").correlation_id() == "seq-a"
    with pytest.raises(pb_utils.TritonModelException, match="Correlation ID must be integer or string"):
        pb_utils.InferenceRequest(correlation_id=1.5, inputs=[t], model_name="m",  # type: ignore[arg-type]
                                  requested_output_names=[])
    with pytest.raises(pb_utils.TritonModelException, match="values to have type"):
        pb_utils.InferenceRequest(inputs=[t], model_name="m", requested_output_names=[], parameters={"x": [1]})
    req.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL)
    assert not req.rescheduled()
    req.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    assert req.rescheduled() and not req.rescheduled()  # the flag is spent by the backend's look


def test_logger_levels_as_triton_exports_them(caplog: pytest.LogCaptureFixture) -> None:
    assert pb_utils.Logger.LogLevel.INFO == pb_utils.Logger.INFO == pb_utils.LogLevel.INFO
    with caplog.at_level("DEBUG", logger="triton_python_backend_utils"):
        pb_utils.Logger.log("warned", pb_utils.Logger.WARNING)
        pb_utils.Logger.log_verbose("verbose")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("WARNING", "warned"), ("DEBUG", "verbose")]


# --- custom metrics ---------------------------------------------------------------------


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> MetricRegistry:
    """A registry of this test's own (the worker's is process-wide)."""
    fresh = MetricRegistry()
    monkeypatch.setattr("conveyor.workers.backends.python.pb_utils.metrics.REGISTRY", fresh)
    return fresh


def values(registry: MetricRegistry) -> dict[tuple[str, Any], Any]:
    changed, removed = registry.take_changes()
    got: dict[tuple[str, Any], Any] = {
        (s.family, tuple(sorted(s.labels.items()))): (s.value, s.counts) if s.counts else s.value for s in changed
    }
    got.update({key: "removed" for key in removed})
    return got


def test_counter_gauge_histogram(registry: MetricRegistry) -> None:
    labels = {"model": "m", "version": "1"}
    key = (("model", "m"), ("version", "1"))
    families = [pb_utils.MetricFamily("c_total", "a counter", pb_utils.COUNTER),
                pb_utils.MetricFamily("g", "a gauge", pb_utils.GAUGE),
                pb_utils.MetricFamily("h", "a histogram", pb_utils.HISTOGRAM)]  # a metric needs its family
    counter, gauge = families[0].Metric(labels), families[1].Metric(labels)
    hist = families[2].Metric(labels, buckets=[1, 10])
    counter.increment(2)
    counter.increment(3)
    gauge.set(5)
    gauge.increment(-1)
    for v in (0.5, 1, 5, 50):
        hist.observe(v)
    assert counter.value() == 5 and gauge.value() == 4
    assert values(registry) == {("c_total", key): 5, ("g", key): 4, ("h", key): (56.5, [2, 1, 1])}
    assert values(registry) == {}  # nothing changed since
    with pytest.raises(pb_utils.TritonModelException, match="non-negative"):
        counter.increment(-1)
    with pytest.raises(pb_utils.TritonModelException, match="for gauges"):
        counter.set(1)
    with pytest.raises(pb_utils.TritonModelException, match="for histograms"):
        gauge.observe(1)
    with pytest.raises(pb_utils.TritonModelException, match="not supported for histograms"):
        hist.value()


def test_observe_all_is_observe_of_each_value(registry: MetricRegistry) -> None:
    """``observe_all`` (what the vLLM backend records an engine step's per-token values with) leaves a
    histogram as ``observe`` of each value would, and refuses what ``observe`` refuses."""
    key = (("m", "1"),)
    one_family = pb_utils.MetricFamily("one", "d", pb_utils.HISTOGRAM)
    many_family = pb_utils.MetricFamily("many", "d", pb_utils.HISTOGRAM)
    one = one_family.Metric({"m": "1"}, buckets=[1, 10])
    many = many_family.Metric({"m": "1"}, buckets=[1, 10])
    for v in (0.5, 1, 5, 50, 3):
        one.observe(v)
    many.observe_all([0.5, 1, 5.0])
    many.observe_all([])
    many.observe_all([50, 3.0])
    assert values(registry) == {("one", key): (59.5, [2, 2, 1]), ("many", key): (59.5, [2, 2, 1])}
    for bad in ([1.0, float("nan")], [True], ["1"]):
        with pytest.raises(pb_utils.TritonModelException, match="must be a number"):
            many.observe_all(bad)  # type: ignore[arg-type]
    assert values(registry) == {}  # a refused batch records nothing
    with pytest.raises(pb_utils.TritonModelException, match="for histograms"):
        counters = pb_utils.MetricFamily("c_total", "d", pb_utils.COUNTER)
        counters.Metric({"m": "1"}).observe_all([1.0])


def test_a_lazy_series_wakes_the_publisher_once_and_waits_for_its_interval(registry: MetricRegistry) -> None:
    """The vLLM engine's statistics change at every engine step: their series are published lazily
    (``MetricFamily.lazy_metric``), one wake-up per publication and no ``dirty`` (which the worker's
    loop answers on its next turn), while a model's own series still leave at once. A lazy series is
    born lazily too, with its first value: never shown at 0 before its first ``set``."""
    from conveyor.workers import router_session

    woken: list[int] = []
    registry.on_dirty = lambda: woken.append(1)
    steps = pb_utils.MetricFamily("steps_total", "d", pb_utils.COUNTER)
    lazy = steps.lazy_metric({"m": "1"}, value=7.0)
    assert woken == [1] and registry.lazy_dirty and not registry.dirty
    assert values(registry) == {("steps_total", (("m", "1"),)): 7.0}
    woken.clear()
    for _ in range(3):
        lazy.increment(1)
    assert woken == [1] and registry.lazy_dirty and not registry.dirty
    session = router_session.RouterSession.__new__(router_session.RouterSession)  # its metrics timing alone
    session._next_metrics = session._next_lazy = 0.0
    sent: list[bytes] = []
    session.out = cast(Any, SimpleNamespace(send=sent.append))
    session.send_metrics(time.monotonic())
    assert len(sent) == 1 and not registry.lazy_dirty
    lazy.increment(1)
    assert 50 <= session.poll_ms() <= 1000 * router_session.LAZY_METRICS_S + 1  # waits for its interval
    session.metrics_due(time.monotonic())
    assert len(sent) == 1  # not yet
    gauges = pb_utils.MetricFamily("g", "d", pb_utils.GAUGE)
    gauges.Metric({"m": "1"}).set(2)  # a model's own series: on the next turn, the lazy ones with it
    assert registry.dirty and session.poll_ms() <= 1
    session.metrics_due(time.monotonic())
    assert len(sent) == 2 and not registry.dirty and not registry.lazy_dirty


def test_a_metric_whose_family_was_deleted_raises(registry: MetricRegistry) -> None:
    """As Triton (its QA custom_metrics model checks it): a metric does not keep its family."""
    family = pb_utils.MetricFamily("gone", "d", pb_utils.GAUGE)
    metric = family.Metric({"a": "1"})
    del family
    gc.collect()
    for use in (lambda: metric.increment(1), lambda: metric.set(1), metric.value):
        with pytest.raises(pb_utils.TritonModelException, match="'MetricFamily' has been deleted"):
            use()


def test_families_of_one_name_share_series_until_the_last_goes(registry: MetricRegistry) -> None:
    first = pb_utils.MetricFamily("shared_total", "d", pb_utils.COUNTER)
    second = pb_utils.MetricFamily("shared_total", "d", pb_utils.MetricFamily.COUNTER)
    first.Metric({"a": "1"}).increment(1)
    second.Metric({"a": "1"}).increment(1)  # the same series (as two instances of a model in one worker)
    assert second.Metric({"a": "1"}).value() == 2
    with pytest.raises(pb_utils.TritonModelException, match="already exists"):
        pb_utils.MetricFamily("shared_total", "d", pb_utils.GAUGE)
    values(registry)
    del first
    gc.collect()
    assert values(registry) == {}  # the second family still holds it
    del second
    gc.collect()
    assert values(registry) == {("shared_total", (("a", "1"),)): "removed"}


@pytest.mark.parametrize("make,match", [
    (lambda: pb_utils.MetricFamily("bad name", "d", pb_utils.COUNTER), "not a valid metric name"),
    (lambda: pb_utils.MetricFamily("k", "d", 9), "unknown kind"),
    (lambda: pb_utils.MetricFamily("h2", "d", pb_utils.HISTOGRAM).Metric({}), "needs buckets"),
    (lambda: pb_utils.MetricFamily("h3", "d", pb_utils.HISTOGRAM).Metric({}, [5, 1]), "increasing"),
    (lambda: pb_utils.MetricFamily("c2", "d", pb_utils.COUNTER).Metric({}, [1]), "only for histograms"),
    (lambda: pb_utils.MetricFamily("c3", "d", pb_utils.COUNTER).Metric("x"), "must be a dictionary"),  # type: ignore[arg-type]
    (lambda: pb_utils.MetricFamily("c4", "d", pb_utils.COUNTER).Metric({"le-x": "1"}), "not a valid label"),
    (lambda: pb_utils.MetricFamily("c5", "d", pb_utils.COUNTER).Metric({"a": 1}), "must be a string"),  # type: ignore[dict-item]
])
def test_metric_misuse_is_refused(registry: MetricRegistry, make: Any, match: str) -> None:
    with pytest.raises(pb_utils.TritonModelException, match=match):
        make()


def test_arguments_tritons_binding_cannot_convert_are_type_errors() -> None:
    """As Triton's QA argument_validation model checks: None where a value is due is a TypeError."""
    t = pb_utils.Tensor("INPUT0", np.asarray([1, 2], dtype=np.int32))
    for kwargs in ({"inputs": None}, {"model_name": None}, {"requested_output_names": [None]},
                   {"requested_output_names": None}, {"correlation_id": None}, {"request_id": None},
                   {"model_version": None}, {"flags": None}):
        args: dict[str, Any] = {"inputs": [t], "model_name": "m", "requested_output_names": ["o"], **kwargs}
        with pytest.raises(TypeError):
            pb_utils.InferenceRequest(**args)
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceRequest(inputs=[None], model_name="m", requested_output_names=[])  # type: ignore[list-item]
    for missing in ("inputs", "requested_output_names", "model_name"):  # no default in Triton's binding
        given: dict[str, Any] = {"inputs": [t], "model_name": "m", "requested_output_names": ["o"]}
        del given[missing]
        with pytest.raises(TypeError, match=missing):
            pb_utils.InferenceRequest(**given)
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=None)  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=[None])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        pb_utils.Tensor(None, np.zeros(1))  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor.from_dlpack("OUTPUT0", None)
    logger: Any = pb_utils.Logger  # the wrong types are the point
    for call in (lambda: logger.log("x", None), lambda: logger.log("x", 1),
                 lambda: logger.log_info(None), lambda: logger.log_verbose(None)):
        with pytest.raises(TypeError):
            call()


def test_a_family_of_an_existing_name_keeps_the_first_description(registry: MetricRegistry) -> None:
    first = pb_utils.MetricFamily("described", "first description", pb_utils.COUNTER)
    second = pb_utils.MetricFamily("described", "second description", pb_utils.COUNTER)
    second.Metric({}).increment(1)
    assert [s.description for s in registry.everything()] == ["first description"]
    del first, second
