"""Router latency histograms/summaries and their Prometheus text (no processes)."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.ingress.prometheus import render
from conveyor.ingress.system_metrics import GpuSampler
from conveyor.router.observability import histograms as h
from conveyor.router.observability.stats import ModelStats

LEVEL = "unit"


def test_histogram_buckets_follow_le() -> None:
    hist = h.Histogram()
    hist.observe(100_000)  # exactly the 0.0001 s bound: le="0.0001"
    hist.observe(2_000_000, n=3)
    hist.observe(10**12)  # beyond the last bound: +Inf
    assert hist.counts[0] == 1 and hist.counts[-1] == 1 and sum(hist.counts) == 5
    assert hist.sum_ns == 100_000 + 6_000_000 + 10**12


def test_summary_window_and_quantiles() -> None:
    s = h.Summary()
    for ns in range(1, h.SUMMARY_WINDOW * 2 + 1):
        s.observe(ns * 1000)
    doc = s.wire([0.5, 0.99])
    assert doc["count"] == h.SUMMARY_WINDOW * 2
    assert doc["quantiles"]["0.5"] > h.SUMMARY_WINDOW * 1000  # only the recent half is in the window


def test_parse_quantiles() -> None:
    assert h.parse_quantiles("0.9:0.01,0.5:0.05") == [0.5, 0.9]
    with pytest.raises(ValueError):
        h.parse_quantiles("1.5:0.1")


def test_render_has_cumulative_buckets_and_reasons() -> None:
    lat = h.LatencyMetrics()
    lat.succeeded(3_000_000)
    lat.succeeded(30_000_000)
    lat.failed("BACKEND")
    stats = ModelStats("m", "1")
    text = render({"model_stats": [stats.wire()], "pending": {"m:1": 2}, "latency": {"m:1": lat.wire()}})
    assert 'nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 1' in text
    assert 'nv_inference_pending_request_count{model="m",version="1"} 2' in text
    assert 'conveyor_request_duration_seconds_bucket{model="m",version="1",le="+Inf"} 2' in text
    assert 'conveyor_request_duration_seconds_bucket{model="m",version="1",le="0.005"} 1' in text
    assert 'conveyor_request_duration_seconds_count{model="m",version="1"} 2' in text
    assert "nv_inference_request_summary_us" not in text  # summaries are opt-in
    assert "conveyor_adaptive_queue_delay_us" not in text  # only for models with a latency target
    snapshot = {"model_stats": [stats.wire()], "adaptive_delay_ns": {"m:1": 3_000_000}}
    assert 'conveyor_adaptive_queue_delay_us{model="m",version="1"} 3000' in render(snapshot)


@pytest.mark.gpu
def test_gpu_metrics_when_a_gpu_is_present() -> None:
    gpu = GpuSampler.open()
    if gpu is None:
        pytest.skip("no NVML (nvidia-ml-py) or no GPU")
    gpu.sample()
    text = "\n".join(gpu.render())
    for name in ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
                 "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_energy_consumption"):
        assert f"{name}{{gpu_uuid=" in text, name


class _Nvml:
    """NVML's answers for one board, as numbers (no NVML here): the renderer's arithmetic and names."""

    def __init__(self) -> None:
        self.energy_mj = 5_000_000

    def nvmlDeviceGetMemoryInfo(self, h: object) -> Any:
        return type("Mem", (), {"total": 80 << 30, "used": 1 << 30})()

    def nvmlDeviceGetUtilizationRates(self, h: object) -> Any:
        return type("Util", (), {"gpu": 37})()

    def nvmlDeviceGetPowerUsage(self, h: object) -> int:
        return 123_500

    def nvmlDeviceGetPowerManagementLimit(self, h: object) -> int:
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: object) -> int:
        return self.energy_mj


def test_gpu_metrics_in_triton_units_with_energy_since_start() -> None:
    nvml = _Nvml()
    gpu = GpuSampler(nvml, [("GPU-1", object())])
    nvml.energy_mj += 2_500  # 2.5 J after the server started
    gpu.sample()
    text = "\n".join(gpu.render())
    assert 'nv_gpu_utilization{gpu_uuid="GPU-1"} 0.37' in text
    assert 'nv_gpu_power_usage{gpu_uuid="GPU-1"} 123.5' in text
    assert 'nv_gpu_power_limit{gpu_uuid="GPU-1"} 700.0' in text
    assert "# TYPE nv_energy_consumption counter" in text
    assert 'nv_energy_consumption{gpu_uuid="GPU-1"} 2.5' in text


def test_first_response_buckets_from_model_metrics_and_rendered_in_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    from conveyor.proto.model_config import parse_text

    config = parse_text('''
        name: "m" backend: "python" model_transaction_policy { decoupled: true }
        model_metrics { metric_control: [ { metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
                                            histogram_options: { buckets: [ 2.5, 1, 10 ] } } ] }''')
    buckets = h.first_response_buckets_ms(config.model_metrics)
    assert buckets == (1.0, 2.5, 10.0)
    assert h.first_response_buckets_ms(parse_text('name: "d"').model_metrics) == (100.0, 500.0, 2000.0, 5000.0)
    lat = h.LatencyMetrics(buckets)
    assert lat.first_response is not None
    lat.first_response.observe(2_999_999)  # 2 ms, as Triton counts whole milliseconds
    lat.first_response.observe(50_000_000)  # 50 ms: beyond the last bucket
    lat.first_response.observe(999_999)  # 0 ms: in the first bucket
    text = render({"model_stats": [ModelStats("m", "1").wire()], "latency": {"m:1": lat.wire()}})
    family = "nv_inference_first_response_histogram_ms"
    assert f'{family}_bucket{{model="m",version="1",le="1"}} 1' in text
    assert f'{family}_bucket{{model="m",version="1",le="2.5"}} 2' in text
    assert f'{family}_bucket{{model="m",version="1",le="+Inf"}} 3' in text
    # An integer, as Triton's (qa/L0_metrics histogram_metrics_test reads every value with int()).
    assert f'{family}_sum{{model="m",version="1"}} 52\n' in text
    monkeypatch.setattr(h.HistogramConfig, "enabled", False)  # --metrics-config histogram_latencies=false
    assert h.LatencyMetrics(buckets).first_response is None
