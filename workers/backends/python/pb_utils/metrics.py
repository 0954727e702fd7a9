"""Custom metrics: ``pb_utils.MetricFamily`` and ``Metric``, as in Triton.

A model creates a family (name, description, kind) and metrics in it, one per
label set; values live in this worker process (``REGISTRY``), and the worker
sends the series that changed to the router at most every
``workers/router_session.py:METRICS_FLUSH_S`` (``LAZY_METRICS_S`` for series published
lazily: the vLLM engine's), which serves them on ``/metrics`` with
the labels the model gave. As in Triton, families of one name share their
series and a family keeps its metrics alive; a series goes away with the last
family object that made it and that family's metrics (e.g. when its model is
unloaded).
"""

from __future__ import annotations

import enum
import math
import numbers
import re
import threading
import weakref
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from conveyor.workers.backends.python.pb_utils.errors import TritonModelException

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


COUNTER = MetricKind.COUNTER
GAUGE = MetricKind.GAUGE
HISTOGRAM = MetricKind.HISTOGRAM


@dataclass(slots=True)
class Series:
    """One label set of one family: a counter's or gauge's ``value``; a histogram's
    sum in ``value`` and its per-bucket (not cumulative) counts, the last for +Inf."""

    family: str
    description: str
    kind: MetricKind
    labels: dict[str, str]
    buckets: list[float] = field(default_factory=list)
    value: float = 0.0
    counts: list[int] = field(default_factory=list)
    holders: int = 0  # MetricFamily objects that made it


class MetricRegistry:
    """The worker's custom metrics; any thread. ``take_changes`` hands the series that
    changed (and the keys removed) since the last call to whoever publishes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # family -> kind, family objects holding it, the description of the first (Triton keeps it)
        self._kinds: dict[str, tuple[MetricKind, int, str]] = {}
        self._series: dict[SeriesKey, Series] = {}
        self._changed: set[SeriesKey] = set()
        self._removed: set[SeriesKey] = set()
        self._lazy: set[SeriesKey] = set()  # series whose changes wait for the publisher's lazy interval
        self.dirty = False  # read without the lock by the publisher: a hint, re-checked under it
        self.lazy_dirty = False  # only lazy series changed since the last publication
        # Called (under the lock, from the model's thread) when a change follows a publication: the
        # worker wakes its loop, so /metrics shows a model's change at once (models read it back).
        self.on_dirty: Callable[[], None] | None = None

    def _dirty(self) -> None:  # under the lock
        if not self.dirty:
            self.dirty = True
            if self.on_dirty is not None:
                self.on_dirty()

    def hold_family(self, name: str, kind: MetricKind, description: str = "") -> str:
        """One more family object of ``name``; the family's description: the first one's, as
        Triton keeps it for a family of a name that exists."""
        with self._lock:
            current = self._kinds.get(name)
            if current is not None and current[0] != kind:
                raise TritonModelException(
                    f"Failed to create MetricFamily '{name}': a metric family of that name and kind "
                    f"{current[0].name} already exists"
                )
            kept = current[2] if current else description
            self._kinds[name] = (kind, (current[1] if current else 0) + 1, kept)
            return kept

    def release_family(self, name: str, keys: Sequence[SeriesKey]) -> None:
        with self._lock:
            kind, holders, description = self._kinds.get(name, (MetricKind.COUNTER, 1, ""))
            if holders <= 1:
                self._kinds.pop(name, None)
            else:
                self._kinds[name] = (kind, holders - 1, description)
            for key in keys:
                series = self._series.get(key)
                if series is None:
                    continue
                series.holders -= 1
                if series.holders <= 0:
                    del self._series[key]
                    self._lazy.discard(key)
                    self._changed.discard(key)
                    self._removed.add(key)
                    self._dirty()

    def hold_series(self, key: SeriesKey, template: Series, *, lazy: bool = False) -> Series:
        """The series of ``key``, made from ``template`` if new. ``lazy``: its changes, its birth
        included, may wait for the publisher's lazy interval instead of leaving on its loop's next
        turn (the engine's statistics, which change at every engine step; a birth that left at once
        would show the value before the first ``set``)."""
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = template
                self._removed.discard(key)
                if lazy:
                    self._lazy.add(key)
                self._changed_now(key)
            elif template.kind == MetricKind.HISTOGRAM and series.buckets != template.buckets:
                raise TritonModelException(
                    f"Failed to create Metric: the histogram {key[1]} of '{key[0]}' exists with buckets "
                    f"{series.buckets}"
                )
            series.holders += 1
            return series

    def update(self, key: SeriesKey, series: Series, value: float, *, add: bool) -> None:
        """A counter's or gauge's new value (``add``: an increment)."""
        with self._lock:
            series.value = series.value + value if add else value
            self._changed_now(key)

    def observe_all(self, key: SeriesKey, series: Series, values: Sequence[float]) -> None:
        """A histogram's new observations: one lock, one change, however many."""
        with self._lock:
            counts, buckets = series.counts, series.buckets
            for value in values:
                counts[bisect_left(buckets, value)] += 1
            series.value += sum(values)
            self._changed_now(key)

    def _changed_now(self, key: SeriesKey) -> None:  # under the lock
        if key in self._series:  # a series of a released family is no more
            self._changed.add(key)
            if key not in self._lazy:
                self._dirty()
            elif not self.lazy_dirty:  # one wake-up per publication: the loop then waits for its interval
                self.lazy_dirty = True
                if self.on_dirty is not None:
                    self.on_dirty()

    def take_changes(self) -> tuple[list[Series], list[SeriesKey]]:
        """Copies of the series that changed, and the keys of those that went away."""
        with self._lock:
            changed = [
                Series(s.family, s.description, s.kind, s.labels, s.buckets, s.value, list(s.counts))
                for key in self._changed if (s := self._series.get(key)) is not None
            ]
            removed = list(self._removed)
            self._changed.clear()
            self._removed.clear()
            self.dirty = self.lazy_dirty = False
            return changed, removed

    def everything(self) -> list[Series]:
        """Every live series (to publish again to a router that restarted)."""
        with self._lock:
            return [Series(s.family, s.description, s.kind, s.labels, s.buckets, s.value, list(s.counts))
                    for s in self._series.values()]


REGISTRY = MetricRegistry()


class Metric:
    """One label set of a family: ``increment`` (counter, gauge), ``set`` (gauge),
    ``observe`` (histogram), ``value`` (counter, gauge)."""

    def __init__(self, key: SeriesKey, series: Series, family: MetricFamily) -> None:
        self._key = key
        self._series = series
        self._registry = family._registry
        # As in Triton, a metric does not keep its family: once the family is deleted (its series
        # with it), using the metric raises.
        self._family = weakref.ref(family)

    def _check(self) -> None:
        if self._family() is None:
            raise TritonModelException(
                "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
            )

    def increment(self, value: float) -> None:
        self._check()
        kind = self._series.kind
        if kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to increment metric value: a histogram only supports observe()")
        if kind == MetricKind.COUNTER and value < 0:
            raise TritonModelException(
                "Failed to increment metric value: a counter can only be incremented by a non-negative value"
            )
        self._registry.update(self._key, self._series, _number(value), add=True)

    def set(self, value: float) -> None:
        self._check()
        if self._series.kind != MetricKind.GAUGE:
            raise TritonModelException(
                f"Failed to set metric value: set() is for gauges, not a {self._series.kind.name.lower()}"
            )
        self._registry.update(self._key, self._series, _number(value), add=False)

    def observe(self, value: float) -> None:
        self.observe_all((value,))

    def observe_all(self, values: Sequence[float]) -> None:
        """``observe`` each of ``values`` (Conveyor's, for the engine's statistics: a value per
        token of an engine step under one lock)."""
        self._check()
        if self._series.kind != MetricKind.HISTOGRAM:
            raise TritonModelException(
                f"Failed to observe metric value: observe() is for histograms, not a "
                f"{self._series.kind.name.lower()}"
            )
        checked = [v if type(v) is float and v == v else _number(v) for v in values]  # plain floats: no ABC check
        if checked:
            self._registry.observe_all(self._key, self._series, checked)

    def value(self) -> float:
        """This worker process's value (Conveyor's /metrics adds the workers' counters up)."""
        self._check()
        if self._series.kind == MetricKind.HISTOGRAM:
            raise TritonModelException("Failed to get metric value: value() is not supported for histograms")
        return self._series.value


class MetricFamily:
    """``MetricFamily(name, description, kind)`` with ``kind`` one of ``COUNTER``,
    ``GAUGE``, ``HISTOGRAM`` (also ``MetricFamily.COUNTER``, ...)."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind | int) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise TritonModelException(f"Failed to create MetricFamily: '{name}' is not a valid metric name")
        try:
            kind = MetricKind(kind)
        except ValueError:
            raise TritonModelException(f"Failed to create MetricFamily '{name}': unknown kind {kind!r}") from None
        self._name = name
        self._kind = kind
        self._keys: dict[SeriesKey, Series] = {}
        self._description = REGISTRY.hold_family(name, kind, str(description))
        self._registry = REGISTRY  # set once held: __del__ lets go of what it holds

    # lazy_metric and _metric come before Metric: below it, that name in this class is the method
    def lazy_metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None,
                    value: float = 0.0) -> Metric:
        """Conveyor's ``Metric``: one whose birth (with ``value``) and changes reach ``/metrics``
        within the worker's lazy interval (``workers/router_session.py:LAZY_METRICS_S``) rather than
        on its loop's next turn, which a change wakes: for the engine's statistics, which change at
        every engine step. A series already made keeps its way and its value."""
        return self._metric(labels, buckets, lazy=True, initial=value)

    def _metric(self, labels: dict[str, str] | None, buckets: list[float] | None, *, lazy: bool,
                initial: float) -> Metric:
        if labels is None:
            labels = {}
        if not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        for label, value in labels.items():
            if not isinstance(label, str) or not _LABEL.match(label) or label.startswith("__"):
                raise TritonModelException(f"Failed to create metric: '{label}' is not a valid label name")
            if not isinstance(value, str):
                raise TritonModelException(f"Failed to create metric: the value of label '{label}' must be a string")
        bounds = self._buckets(buckets)
        key: SeriesKey = (self._name, tuple(sorted(labels.items())))
        series = self._keys.get(key)
        if series is None:
            template = Series(self._name, self._description, self._kind, dict(labels), bounds, initial,
                              counts=[0] * (len(bounds) + 1) if self._kind == MetricKind.HISTOGRAM else [])
            series = self._keys[key] = self._registry.hold_series(key, template, lazy=lazy)
        return Metric(key, series, self)

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:
        """The metric of this label set (made on first use; the same one after)."""
        return self._metric(labels, buckets, lazy=False, initial=0.0)

    def _buckets(self, buckets: list[float] | None) -> list[float]:
        if self._kind != MetricKind.HISTOGRAM:
            if buckets is not None:
                raise TritonModelException("Failed to create metric: buckets are only for histograms")
            return []
        if buckets is None:  # [] is a histogram of the +Inf bucket alone, as in Triton
            raise TritonModelException("Failed to create metric: a histogram needs buckets")
        bounds = [_number(b) for b in buckets]
        if bounds != sorted(set(bounds)):
            raise TritonModelException("Failed to create metric: buckets must be increasing")
        return bounds

    def __del__(self) -> None:
        registry = getattr(self, "_registry", None)
        if registry is not None:
            registry.release_family(self._name, list(self._keys))


def _number(value: float) -> float:
    kind = type(value)
    if kind is float:  # the common cases first: the ABC check below costs a microsecond a call
        if value != value:  # NaN
            raise TritonModelException(f"a metric value must be a number, got {value!r}")
        return value
    if kind is int:
        return float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise TritonModelException(f"a metric value must be a number, got {value!r}")
    return float(value)
