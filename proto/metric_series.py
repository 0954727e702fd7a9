"""The names of the per-model series the router's ``metrics`` control op reports, shared by the router,
which records them (``router/observability/histograms.py``, ``router/scheduling/overload.py``), and the
ingress, which renders them for Prometheus (``ingress/prometheus.py``): the latency histograms' bucket
bounds, the label values of the failure and overload counters, the first-response family's name."""

from __future__ import annotations

import enum

# Upper bounds in seconds (Prometheus ``le``), from sub-millisecond CPU models to slow LLM calls.
BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

# Triton's time to first response (decoupled models): its family's name.
FIRST_RESPONSE_FAMILY = "nv_inference_first_response_histogram_ms"


class OverloadReason(enum.Enum):
    """Why a request was refused: the ``reason`` label of ``conveyor_overload_refusals_total``."""

    WAITING = "max_waiting_requests"
    KV_CACHE = "max_kv_cache_usage"


OVERLOAD_REASONS = tuple(r.value for r in OverloadReason)
