"""Custom metrics (``pb_utils.MetricFamily``) of a Python model, served by the real
process group on /metrics with the labels the model gave, added up over the
workers that run the model (the test server has two)."""

from __future__ import annotations

import time

import numpy as np
import tritonclient.http as httpclient

from tests.support.group import Server
from tests.support.metrics import metrics_text

LEVEL = "e2e"

LABELS = 'model="py_metrics",version="1"'


def sample(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_custom_metrics_on_the_metrics_endpoint(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    values = [5, 50, 500, 0]
    before = sample(metrics_text(server), f"conveyor_test_requests_total{{{LABELS}}}") or 0
    for v in values:
        inp = httpclient.InferInput("IN", [1], "INT32")
        inp.set_data_from_numpy(np.array([v], dtype=np.int32))
        client.infer("py_metrics", [inp])
    deadline = time.monotonic() + 10
    while sample(text := metrics_text(server), f"conveyor_test_requests_total{{{LABELS}}}") != before + len(values):
        assert time.monotonic() < deadline, text  # workers send their changes within ~0.25 s
        time.sleep(0.1)
    assert "# HELP conveyor_test_requests_total Requests seen by the model\n" \
           "# TYPE conveyor_test_requests_total counter\n" in text
    assert "# TYPE conveyor_test_last_value gauge\n" in text
    assert sample(text, f"conveyor_test_last_value{{{LABELS}}}") in values  # the last a worker reported
    assert "# TYPE conveyor_test_value histogram\n" in text
    le = {bound: sample(text, f'conveyor_test_value_bucket{{{LABELS},le="{bound}"}}') for bound in ("1", "10", "100")}
    count = sample(text, f"conveyor_test_value_count{{{LABELS}}}")
    assert count is not None and count >= len(values)
    if count == len(values):  # the first time this server's model ran
        assert le == {"1": 1, "10": 2, "100": 3}
        assert sample(text, f'conveyor_test_value_bucket{{{LABELS},le="+Inf"}}') == 4
        assert sample(text, f"conveyor_test_value_sum{{{LABELS}}}") == 555
