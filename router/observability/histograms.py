"""Latency distributions the router records per model version (beyond the statistics extension).

The router sees every request of the group, so one scrape of its figures gives
the whole group, and Prometheus histograms (unlike Triton's summaries) add up
across hosts. Recording is on the router's hot path: one ``bisect`` and two
additions per sample into lists allocated once; summaries (Triton's opt-in
``--metrics-config summary_latencies=true``) cost one slot write more.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from conveyor.proto.metric_series import BUCKETS_S, FAILURE_REASONS, FIRST_RESPONSE_FAMILY

# Upper bounds: proto/metric_series.py (the ingress renders them as ``le``).
_BOUNDS_NS: list[int] = [round(b * 1e9) for b in BUCKETS_S]

# Triton's default ``summary_quantiles``: quantile -> allowed error.
DEFAULT_QUANTILES: dict[float, float] = {0.5: 0.05, 0.9: 0.01, 0.95: 0.001, 0.99: 0.001}
# A summary's quantiles are over this many most recent samples (Triton: a sliding time window).
SUMMARY_WINDOW = 1024


class Histogram:
    """Counts per bucket (not cumulative: cumulated when rendered) and the sum, in ns."""

    __slots__ = ("bounds_ns", "counts", "sum_ns")

    def __init__(self, bounds_ns: list[int] = _BOUNDS_NS) -> None:
        self.bounds_ns = bounds_ns
        self.counts = [0] * (len(bounds_ns) + 1)  # the last one is +Inf
        self.sum_ns = 0

    def observe(self, ns: int, n: int = 1) -> None:
        """``n`` samples of ``ns`` each (a batch charges its compute time to each request)."""
        self.counts[bisect_left(self.bounds_ns, ns)] += n
        self.sum_ns += ns * n

    def wire(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sum_ns": self.sum_ns}


# Triton's time to first response (decoupled models): its default buckets in ms.
FIRST_RESPONSE_BUCKETS_MS: tuple[float, ...] = (100.0, 500.0, 2000.0, 5000.0)


class HistogramConfig:
    """``--metrics-config histogram_latencies`` (Triton's flag); on by default here, off with ``false``.
    ``every_model``: given as true, Triton's opt-in: the time to first response of every model, ensembles
    included (Triton keeps one per model); else of decoupled models only, which pay nothing per request more."""

    enabled = True
    every_model = False


def first_response_buckets_ms(model_metrics: Any) -> tuple[float, ...]:
    """The config's ``model_metrics`` buckets for the first-response family, as Triton reads them, or the default."""
    for control in model_metrics.metric_control:
        if control.metric_identifier.family == FIRST_RESPONSE_FAMILY and control.histogram_options.buckets:
            return tuple(sorted(control.histogram_options.buckets))
    return FIRST_RESPONSE_BUCKETS_MS


def uncustomizable_families(model_metrics: Any) -> list[str]:
    """The ``model_metrics`` families whose buckets Triton's core cannot set (it warns of each and loads the
    model: only the first-response histogram is customizable)."""
    return [c.metric_identifier.family for c in model_metrics.metric_control
            if c.metric_identifier.family != FIRST_RESPONSE_FAMILY]


class FirstResponse:
    """Time from a decoupled request's arrival in the router to its first response."""

    __slots__ = ("buckets_ms", "histogram")

    def __init__(self, buckets_ms: tuple[float, ...]) -> None:
        self.buckets_ms = buckets_ms
        self.histogram = Histogram([round(b * 1e6) for b in buckets_ms])

    def observe(self, ns: int) -> None:
        """As Triton, whole milliseconds ((now - start) / NANOS_PER_MILLIS): its buckets and sum are of those."""
        self.histogram.observe(ns - ns % 1_000_000)

    def wire(self) -> dict[str, Any]:
        return {**self.histogram.wire(), "buckets_ms": list(self.buckets_ms)}


class Summary:
    """The last ``SUMMARY_WINDOW`` samples in a ring, plus all-time count and sum."""

    __slots__ = ("count", "ring", "sum_ns")

    def __init__(self) -> None:
        self.ring: list[int] = []
        self.count = 0
        self.sum_ns = 0

    def observe(self, ns: int) -> None:
        if len(self.ring) < SUMMARY_WINDOW:
            self.ring.append(ns)
        else:
            self.ring[self.count % SUMMARY_WINDOW] = ns
        self.count += 1
        self.sum_ns += ns

    def wire(self, quantiles: list[float]) -> dict[str, Any]:
        ordered = sorted(self.ring)
        values = {str(q): ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0 for q in quantiles}
        return {"count": self.count, "sum_ns": self.sum_ns, "quantiles": values}


class SummaryConfig:
    """Triton's ``--metrics-config summary_latencies`` / ``summary_quantiles``, set once at start."""

    enabled = False
    quantiles: list[float] = sorted(DEFAULT_QUANTILES)


def parse_quantiles(text: str) -> list[float]:
    """``0.5:0.05,0.9:0.01`` (quantile:error pairs, Triton's syntax) -> the quantiles."""
    out = []
    for pair in text.split(","):
        q = float(pair.split(":", 1)[0])
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} is not within [0, 1]")
        out.append(q)
    return sorted(out)


SUMMARY_KINDS = ("request", "queue", "compute_input", "compute_infer", "compute_output")
CACHE_SUMMARY_KINDS = ("cache_hit", "cache_miss")


class LatencyMetrics:
    """One model version's histograms, failure reasons and (opt-in) summaries; a decoupled model's (every
    model's with ``HistogramConfig.every_model``) also its time to first response (``first_response``, else None)."""

    __slots__ = ("cached", "compute", "failures", "first_response", "queue", "request", "summaries")

    def __init__(self, first_response_ms: tuple[float, ...] | None = None, cached: bool = False) -> None:
        self.first_response = (
            FirstResponse(first_response_ms) if first_response_ms is not None and HistogramConfig.enabled else None
        )
        self.cached = cached  # a response-cache model: the only ones with cache metrics, as in Triton
        self.request = Histogram()
        self.queue = Histogram()
        self.compute = Histogram()
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)
        # A response-cache model: Triton adds its cache summaries and leaves out the request
        # summary (its core: "disabled when cache is enabled to avoid publishing misleading metrics").
        kinds = (*SUMMARY_KINDS[1:], *CACHE_SUMMARY_KINDS) if cached else SUMMARY_KINDS
        self.summaries: dict[str, Summary] | None = {k: Summary() for k in kinds} if SummaryConfig.enabled else None

    def succeeded(self, request_ns: int) -> None:
        h = self.request  # ``Histogram.observe``, inlined here, in ``queued`` and in ``computed``: per request
        h.counts[bisect_left(h.bounds_ns, request_ns)] += 1
        h.sum_ns += request_ns
        if self.summaries is not None:
            request = self.summaries.get("request")
            if request is not None:
                request.observe(request_ns)

    def cache_looked_up(self, hit: bool, ns: int) -> None:
        """A response-cache lookup (a hit's whole duration; a miss's lookup, its insertion
        comes later and counts in ``nv_cache_miss_duration_per_model`` only)."""
        if self.summaries is not None:
            summary = self.summaries.get("cache_hit" if hit else "cache_miss")
            if summary is not None:
                summary.observe(ns)

    def queued(self, queue_ns: int) -> None:
        h = self.queue
        h.counts[bisect_left(h.bounds_ns, queue_ns)] += 1
        h.sum_ns += queue_ns
        if self.summaries is not None:
            self.summaries["queue"].observe(queue_ns)

    def computed(self, requests: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        h, ns = self.compute, input_ns + infer_ns + output_ns
        h.counts[bisect_left(h.bounds_ns, ns)] += requests
        h.sum_ns += ns * requests
        s = self.summaries
        if s is not None:
            for _ in range(requests):
                s["compute_input"].observe(input_ns)
                s["compute_infer"].observe(infer_ns)
                s["compute_output"].observe(output_ns)

    def failed(self, reason: str) -> None:
        self.failures[reason] += 1

    def wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "request": self.request.wire(), "queue": self.queue.wire(), "compute": self.compute.wire(),
            "failures": dict(self.failures),
        }
        if self.summaries is not None:
            doc["summaries"] = {k: s.wire(SummaryConfig.quantiles) for k, s in self.summaries.items()}
        if self.first_response is not None:
            doc["first_response"] = self.first_response.wire()
        if self.cached:
            doc["cached"] = True
        return doc


def failure_reason(status: int) -> str:
    """Triton's ``reason`` label for a request a worker answered with an error."""
    if status == 7:  # Status.CANCELLED
        return "CANCELED"
    if status == 4:  # Status.UNAVAILABLE: the worker or instance went away, not the model's fault
        return "OTHER"
    return "BACKEND"


def configure_summaries(config: dict[str, str]) -> None:
    """Apply ``--metrics-config summary_latencies``/``summary_quantiles``/``histogram_latencies``
    before any model loads."""
    SummaryConfig.enabled = config.get("summary_latencies", "false").lower() in ("1", "true", "yes", "on")
    HistogramConfig.enabled = config.get("histogram_latencies", "true").lower() in ("1", "true", "yes", "on")
    HistogramConfig.every_model = "histogram_latencies" in config and HistogramConfig.enabled
    if "summary_quantiles" in config:
        SummaryConfig.quantiles = parse_quantiles(config["summary_quantiles"])
