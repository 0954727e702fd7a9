"""Models' custom metrics in the router (several workers' reports) and as
/metrics renders them."""

from __future__ import annotations

from conveyor.ingress.prometheus import render
from conveyor.proto import messages as m
from conveyor.router.observability.custom_metrics import CustomMetricsStore

LEVEL = "unit"

LABELS = {"model": "m", "version": "1"}


def counter(value: float, **kw: object) -> m.CustomMetric:
    return m.CustomMetric("reqs_total", "Requests", 0, dict(LABELS), value, **kw)  # type: ignore[arg-type]


def test_workers_counters_add_up_and_a_gauge_shows_the_last_value() -> None:
    store = CustomMetricsStore()
    store.update(b"w1", [counter(2), m.CustomMetric("last", "Last", 1, dict(LABELS), 7)])
    store.update(b"w2", [counter(3), m.CustomMetric("last", "Last", 1, dict(LABELS), 9)])
    store.update(b"w1", [m.CustomMetric("last", "Last", 1, dict(LABELS), 4)])
    wire = {f["name"]: f for f in store.wire()}
    assert wire["reqs_total"]["series"] == [{"labels": LABELS, "value": 5}]
    assert wire["last"]["series"] == [{"labels": LABELS, "value": 4}]
    store.forget(b"w2")  # a worker that leaves takes its series along
    assert {f["name"]: f["series"][0]["value"] for f in store.wire()} == {"last": 4, "reqs_total": 2}
    store.update(b"w1", [counter(0, removed=True)])
    assert [f["name"] for f in store.wire()] == ["last"]


def test_prometheus_text_of_custom_metrics() -> None:
    store = CustomMetricsStore()
    store.update(b"w1", [
        counter(2.5),
        m.CustomMetric("lat", 'Latency "ms"\nof requests', 2, {"q": 'a"b'}, 56.5, [1.0, 10.0], [2, 1, 1]),
    ])
    store.update(b"w2", [m.CustomMetric("lat", "Latency", 2, {"q": 'a"b'}, 3.0, [1.0, 10.0], [0, 1, 0])])
    text = render({"model_stats": [], "custom": store.wire()})
    assert "# HELP reqs_total Requests\n# TYPE reqs_total counter\n" in text
    assert 'reqs_total{model="m",version="1"} 2.5\n' in text
    assert "# HELP lat Latency \"ms\"\\nof requests\n# TYPE lat histogram\n" in text
    buckets = [f'lat_bucket{{q="a\\"b",le="{le}"}} {n}' for le, n in (("1", 2), ("10", 4), ("+Inf", 5))]
    assert "\n".join(buckets) in text
    assert 'lat_sum{q="a\\"b"} 59.5\nlat_count{q="a\\"b"} 5\n' in text
