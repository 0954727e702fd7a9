"""/metrics against the statistics extension, on a group of its own (summaries on)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from conveyor.deploy.example_repo import add_sub
from tests.support.group import Server, start_server
from tests.support.metrics import scrape

LEVEL = "e2e"

N = 5


@pytest.fixture(scope="module")
def metrics_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("metrics_models"))
    add_sub(repo, "simple_nobatch", 0)
    srv = start_server(repo, f"m{os.getpid()}", "--workers", "1", "--grpc-ingress", "0",
                       "--metrics-config", "summary_latencies=true", "--metrics-interval-ms", "100", grpc=False)
    yield srv
    assert srv.stop() == 0


def test_metrics_match_statistics_and_request_count(metrics_server: Server) -> None:
    client = httpclient.InferenceServerClient(metrics_server.http_url)
    a = np.arange(16, dtype=np.int32)
    for _ in range(N):
        inputs = [httpclient.InferInput("INPUT0", [16], "INT32"), httpclient.InferInput("INPUT1", [16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        client.infer("simple_nobatch", inputs)
    stats = client.get_inference_statistics("simple_nobatch")["model_stats"][0]
    inf = stats["inference_stats"]
    got = scrape(metrics_server)
    lab = 'model="simple_nobatch",version="1"'

    assert got[f"nv_inference_request_success{{{lab}}}"] == N == inf["success"]["count"]
    assert got[f"nv_inference_count{{{lab}}}"] == stats["inference_count"] == N
    assert got[f"nv_inference_exec_count{{{lab}}}"] == stats["execution_count"] == N
    assert got[f"nv_inference_request_duration_us{{{lab}}}"] == inf["success"]["ns"] // 1000
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert got[f"nv_inference_{key}_duration_us{{{lab}}}"] == inf[key]["ns"] // 1000
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert got[f'nv_inference_request_failure{{model="simple_nobatch",reason="{reason}",version="1"}}'] == 0
    assert got[f"nv_inference_pending_request_count{{{lab}}}"] == 0

    for name in ("request", "queue", "compute"):
        metric = f"conveyor_{name}_duration_seconds"
        buckets = [v for k, v in got.items() if k.startswith(f"{metric}_bucket{{{lab}")]
        assert len(buckets) > 2 and buckets == sorted(buckets), buckets
        assert buckets[-1] == got[f"{metric}_count{{{lab}}}"] == N
        assert got[f"{metric}_sum{{{lab}}}"] > 0
    assert got[f"nv_inference_request_summary_us_count{{{lab}}}"] == N
    assert f'nv_inference_request_summary_us{{{lab},quantile="0.5"}}' in got

    assert got["nv_cpu_memory_total_bytes"] >= got["nv_cpu_memory_used_bytes"] > 0
    assert 0.0 <= got["nv_cpu_utilization"] <= 1.0
