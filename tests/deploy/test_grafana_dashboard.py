"""The Grafana dashboard is JSON and its panels query metrics /metrics exports."""

from __future__ import annotations

import json
import re

from conveyor.ingress import prometheus, system_metrics
from tests.support.paths import ROOT

LEVEL = "unit"

DASHBOARD = ROOT / "deploy" / "grafana" / "conveyor.json"


def exported_names() -> set[str]:
    names = {n for table in (prometheus._COUNTERS, prometheus._LATENCY_COUNTERS, prometheus._SUMMARIES)
             for n, _, _ in table}
    names |= {f"{n}_{suffix}" for n, _, _ in prometheus._HISTOGRAMS for suffix in ("bucket", "sum", "count")}
    names |= {"nv_inference_request_failure", "nv_inference_pending_request_count"}
    names |= {n for n, _, _ in system_metrics._GPU_METRICS}
    names |= {line.split()[2] for line in system_metrics.CpuSampler().render() if line.startswith("# TYPE")}
    return names


def test_dashboard_panels_reference_exported_metrics() -> None:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    assert len(doc["panels"]) >= 8 and exprs
    known = exported_names()
    for expr in exprs:
        used = {w for w in re.findall(r"\b(?:nv|conveyor)_[a-z_]+\b", expr)}
        assert used, expr
        assert used <= known, (expr, used - known)
    titles = " ".join(p["title"] for p in doc["panels"]).lower()
    for topic in ("rate", "failure", "p99", "queue", "batch", "cpu", "gpu"):
        assert topic in titles
