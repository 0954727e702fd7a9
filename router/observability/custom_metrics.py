"""Models' custom metrics (``pb_utils.MetricFamily``), as the workers report them.

Each worker sends the series that changed (``CustomMetrics``); this keeps the
latest of each per worker and serves them on ``/metrics`` (the ``metrics``
control op) with the labels the model gave. Several workers may run the same
model: their counters and histograms are added up, and a gauge shows the value
set last. A worker that leaves takes its series with it, as a Triton Python
model's stub does.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from conveyor.proto import messages as m

_GAUGE = 1
_HISTOGRAM = 2
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(slots=True)
class _Reported:
    metric: m.CustomMetric
    seq: int  # when it was reported, for "the gauge set last"


class CustomMetricsStore:
    def __init__(self) -> None:
        self._by_worker: dict[bytes, dict[SeriesKey, _Reported]] = {}
        self._seq = itertools.count()

    def update(self, worker: bytes, metrics: list[m.CustomMetric]) -> None:
        mine = self._by_worker.setdefault(worker, {})
        for metric in metrics:
            key = (metric.family, tuple(sorted(metric.labels.items())))
            if metric.removed:
                mine.pop(key, None)
            else:
                mine[key] = _Reported(metric, next(self._seq))

    def forget(self, worker: bytes) -> None:
        self._by_worker.pop(worker, None)

    def wire(self) -> list[dict[str, Any]]:
        """One entry per family (name, description, kind, series), in name order;
        each series: labels, value and, for a histogram, buckets and counts."""
        merged: dict[SeriesKey, list[_Reported]] = {}
        for mine in self._by_worker.values():
            for key, reported in mine.items():
                merged.setdefault(key, []).append(reported)
        families: dict[str, dict[str, Any]] = {}
        for key in sorted(merged):
            reports = merged[key]
            first = min(reports, key=lambda r: r.seq).metric
            family = families.setdefault(first.family, {
                "name": first.family, "description": first.description, "kind": first.kind, "series": [],
            })
            same = [r for r in reports if r.metric.kind == family["kind"]
                    and r.metric.buckets == first.buckets]  # a worker that disagrees is left out
            family["series"].append(_combine(family["kind"], first, same))
        return list(families.values())


def _combine(kind: int, first: m.CustomMetric, reports: list[_Reported]) -> dict[str, Any]:
    series: dict[str, Any] = {"labels": first.labels}
    if kind == _GAUGE:
        series["value"] = max(reports, key=lambda r: r.seq).metric.value
    else:
        series["value"] = sum(r.metric.value for r in reports)
    if kind == _HISTOGRAM:
        series["buckets"] = first.buckets
        series["counts"] = [sum(c) for c in zip(*(r.metric.counts for r in reports), strict=True)]
    return series
