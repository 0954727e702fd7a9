"""Prometheus text for the per-model figures the router sends (the ``metrics`` control op).

Triton's names and labels (``model``, ``version``; failures add ``reason``), plus
Conveyor's histograms ``conveyor_*_duration_seconds``; in OpenTelemetry trace
mode, the span exporter's counters ``conveyor_trace_spans_*_total``; the gRPC ingress
processes that fell back to h2 (``conveyor_grpc_ngh2_self_test_failures_total``); and the
models' custom metrics (``pb_utils.MetricFamily``) under the names and labels
the models gave.
"""

from __future__ import annotations

from typing import Any

from conveyor.proto.metric_series import BUCKETS_S, FAILURE_REASONS, FIRST_RESPONSE_FAMILY, OVERLOAD_REASONS

# (metric, help, where to read it in one model_stats entry); "x.us" is a duration's ns / 1000.
_COUNTERS: list[tuple[str, str, str]] = [
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes", "success.count"),
    ("nv_inference_count", "Number of inferences performed (a batch of n counts n)", "inference_count"),
    ("nv_inference_exec_count", "Number of model executions performed", "execution_count"),
    ("nv_cache_num_hits_per_model", "Number of response cache hits per model", "cache_hit.count"),
    ("nv_cache_num_misses_per_model", "Number of response cache misses per model", "cache_miss.count"),
]
_LATENCY_COUNTERS: list[tuple[str, str, str]] = [
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds", "success.us"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds", "queue.us"),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     "compute_input.us"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     "compute_infer.us"),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     "compute_output.us"),
    ("nv_cache_hit_duration_per_model", "Total cache hit lookup duration per model, in microseconds",
     "cache_hit.us"),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     "cache_miss.us"),
]
# Triton's opt-in summaries (--metrics-config summary_latencies=true), by the router's summary kind.
_SUMMARIES: list[tuple[str, str, str]] = [
    ("nv_inference_request_summary_us", "Summary of inference request duration in microseconds", "request"),
    ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds", "queue"),
    ("nv_inference_compute_input_summary_us", "Summary of compute input duration in microseconds",
     "compute_input"),
    ("nv_inference_compute_infer_summary_us", "Summary of compute inference duration in microseconds",
     "compute_infer"),
    ("nv_inference_compute_output_summary_us", "Summary of compute output duration in microseconds",
     "compute_output"),
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds.",
     "cache_hit"),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds.",
     "cache_miss"),
]
_HISTOGRAMS: list[tuple[str, str, str]] = [
    ("conveyor_request_duration_seconds", "Successful request duration, router arrival to answer", "request"),
    ("conveyor_queue_duration_seconds", "Time requests waited in the router's queue", "queue"),
    ("conveyor_compute_duration_seconds", "Compute time (input + infer + output) charged to each request",
     "compute"),
]
_LE = [repr(b) for b in BUCKETS_S] + ["+Inf"]
_TRACE_EXPORT: list[tuple[str, str, str]] = [
    ("conveyor_trace_spans_exported_total", "Spans the OTLP collector accepted", "exported"),
    ("conveyor_trace_spans_dropped_total", "Spans dropped because the export queue was full", "dropped"),
    ("conveyor_trace_spans_failed_total", "Spans whose export to the OTLP collector failed", "failed"),
]


def _value(stats: dict[str, Any], path: str) -> int:
    if "." not in path:
        return int(stats[path])
    key, unit = path.split(".")
    d = stats["inference_stats"][key]
    return int(d["count"]) if unit == "count" else int(d["ns"]) // 1000


def _labels(s: dict[str, Any]) -> str:
    return f'model="{s["name"]}",{_namespace(s)}version="{s["version"]}"'


def _namespace(s: dict[str, Any]) -> str:
    """Triton's ``namespace`` label (with --model-namespacing: the model's repository)."""
    return f'namespace="{s["namespace"]}",' if "namespace" in s else ""


def _id(s: dict[str, Any]) -> str:
    """The key of a version in the snapshot's per-version maps."""
    return f'{s.get("key", s["name"])}:{s["version"]}'


def _header(lines: list[str], name: str, help_text: str, kind: str) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")


def render(snapshot: dict[str, Any], *, counter_latencies: bool = True) -> str:
    """``snapshot``: the router's answer to ``metrics`` (``model_stats`` as the statistics
    extension returns it, ``pending`` and ``latency`` keyed by "model:version")."""
    model_stats: list[dict[str, Any]] = snapshot["model_stats"]
    pending: dict[str, int] = snapshot.get("pending", {})
    latency: dict[str, dict[str, Any]] = snapshot.get("latency", {})
    lines: list[str] = []
    # Cache families only for response-cache models, and not at all without one (as Triton's reporter).
    cached = [s for s in model_stats if latency.get(_id(s), {}).get("cached")]
    for name, help_text, path in _COUNTERS + (_LATENCY_COUNTERS if counter_latencies else []):
        rows = cached if name.startswith("nv_cache_") else model_stats
        if not rows and rows is cached:
            continue
        _header(lines, name, help_text, "counter")
        lines += [f"{name}{{{_labels(s)}}} {_value(s, path)}" for s in rows]
    _header(lines, "nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "counter")
    for s in model_stats:
        failures = latency.get(_id(s), {}).get("failures", {})
        for reason in FAILURE_REASONS:
            labels = f'model="{s["name"]}",{_namespace(s)}reason="{reason}",version="{s["version"]}"'
            lines.append(f"nv_inference_request_failure{{{labels}}} {failures.get(reason, 0)}")
    _header(lines, "nv_inference_pending_request_count", "Number of requests waiting in the queue", "gauge")
    for s in model_stats:
        depth = pending.get(_id(s), 0)
        lines.append(f"nv_inference_pending_request_count{{{_labels(s)}}} {depth}")
    loads: dict[str, int] = snapshot.get("load_duration_ns", {})
    _header(lines, "nv_model_load_duration_secs", "Model load time in seconds", "gauge")
    for s in model_stats:
        took = loads.get(_id(s), 0)
        lines.append(f"nv_model_load_duration_secs{{{_labels(s)}}} {_number(took / 1e9)}")
    _render_overload(lines, model_stats, snapshot.get("overload", {}))
    _render_migrations(lines, model_stats, snapshot.get("migrations", {}))
    _render_prefix_evictions(lines, model_stats, snapshot.get("prefix_evictions", {}))
    _render_session_placements(lines, model_stats, snapshot.get("session_placements", {}))
    adaptive: dict[str, int] = snapshot.get("adaptive_delay_ns", {})
    if adaptive:
        _header(lines, "conveyor_adaptive_queue_delay_us",
                "Queue delay chosen by adaptive batching (conveyor.latency_target_us)", "gauge")
        for s in model_stats:
            delay = adaptive.get(_id(s))
            if delay is not None:
                lines.append(f"conveyor_adaptive_queue_delay_us{{{_labels(s)}}} {delay // 1000}")
    _render_summaries(lines, model_stats, latency)
    _render_histograms(lines, model_stats, latency)
    _render_first_response(lines, model_stats, latency)
    exported = snapshot.get("trace_export")
    if exported is not None:
        for name, help_text, key in _TRACE_EXPORT:
            _header(lines, name, help_text, "counter")
            lines.append(f"{name} {exported[key]}")
    _header(lines, "conveyor_grpc_ngh2_self_test_failures_total",
            "gRPC ingress processes serving on h2 because the ngh2 HTTP/2 engine failed its start-up self-test",
            "counter")
    lines.append(f"conveyor_grpc_ngh2_self_test_failures_total {snapshot.get('ngh2_self_test_failures', 0)}")
    _render_custom(lines, snapshot.get("custom", []))
    return "\n".join(lines) + "\n"


def _render_overload(lines: list[str], model_stats: list[dict[str, Any]], overload: dict[str, Any]) -> None:
    """The requests each version's MAX_WAITING_REQUESTS counts, and the requests refused past its limits
    (router/scheduling/overload.py), every reason shown as Triton shows every failure reason."""
    if not overload:
        return
    _header(lines, "conveyor_waiting_requests",
            "Requests queued in the router or sent to the model and not answered yet (MAX_WAITING_REQUESTS)",
            "gauge")
    for s in model_stats:
        lines.append(f"conveyor_waiting_requests{{{_labels(s)}}} {overload.get(_id(s), {}).get('waiting', 0)}")
    _header(lines, "conveyor_overload_refusals_total",
            "Requests refused at once because the model was past a limit (MAX_WAITING_REQUESTS, MAX_KV_CACHE_USAGE)",
            "counter")
    for s in model_stats:
        refusals = overload.get(_id(s), {}).get("refusals", {})
        for reason in OVERLOAD_REASONS:
            labels = f'model="{s["name"]}",{_namespace(s)}reason="{reason}",version="{s["version"]}"'
            lines.append(f"conveyor_overload_refusals_total{{{labels}}} {refusals.get(reason, 0)}")


def _render_migrations(lines: list[str], model_stats: list[dict[str, Any]], migrations: dict[str, int]) -> None:
    """Requests sent to another engine after their worker died (docs/LLM.md): only the versions that
    had one, so that every other model's /metrics stays as it was."""
    rows = [(s, migrations[_id(s)]) for s in model_stats if migrations.get(_id(s))]
    if not rows:
        return
    _header(lines, "conveyor_request_migrations_total",
            "Requests sent again to another engine after the worker running them exited (MAX_MIGRATIONS)", "counter")
    lines += [f"conveyor_request_migrations_total{{{_labels(s)}}} {count}" for s, count in rows]


def _render_prefix_evictions(lines: list[str], model_stats: list[dict[str, Any]],
                             evictions: dict[str, dict[str, int]]) -> None:
    """Prefix keys engine placement forgot because their engine no longer held them (its KV-cache events,
    or a new engine), per engine: only the versions that had some."""
    rows = [(s, evictions[_id(s)]) for s in model_stats if evictions.get(_id(s))]
    if not rows:
        return
    name = "conveyor_engine_prefix_evictions_total"
    _header(lines, name, "Prompt prefixes engine placement stopped sending to an engine because its KV cache "
            "no longer held them (KV-cache events)", "counter")
    for s, by_engine in rows:
        lines += [f'{name}{{engine="{engine}",{_labels(s)}}} {count}' for engine, count in sorted(by_engine.items())]


def _render_session_placements(lines: list[str], model_stats: list[dict[str, Any]],
                               counted: dict[str, dict[str, dict[str, int]]]) -> None:
    """Requests that named a session (``x-session-id``, ``prompt_cache_key``), per engine they went to and
    outcome: ``hit`` (the engine of the session's previous turn), ``miss`` (moved off it: not ready or too
    loaded), ``new`` (a session not in the record): only the versions that had some."""
    rows = [(s, counted[_id(s)]) for s in model_stats if counted.get(_id(s))]
    if not rows:
        return
    name = "conveyor_engine_session_placements_total"
    _header(lines, name, "Requests of a session placed by engine placement: on its previous turn's engine (hit), "
            "moved off it (miss), or a session not in its record (new)", "counter")
    for s, by_engine in rows:
        labels = f'model="{s["name"]}",{_namespace(s)}'  # Triton's order: by name, version last
        lines += [f'{name}{{engine="{engine}",{labels}outcome="{outcome}",version="{s["version"]}"}} {count}'
                  for engine, outcomes in sorted(by_engine.items()) for outcome, count in outcomes.items()]


def _le(bound: float) -> str:
    """A bucket bound as Triton writes it: ``100``, ``2.5``."""
    return str(int(bound)) if bound == int(bound) else repr(bound)


def _render_first_response(lines: list[str], model_stats: list[dict[str, Any]], latency: dict[str, Any]) -> None:
    """Triton's time to first response of every model, in ms, with the model's own buckets."""
    rows = [(s, latency[_id(s)]["first_response"]) for s in model_stats
            if "first_response" in latency.get(_id(s), {})]
    if not rows:
        return
    name = FIRST_RESPONSE_FAMILY
    _header(lines, name, "Duration from request to first response in milliseconds", "histogram")
    for s, hist in rows:
        labels = _labels(s)
        total = 0
        for le, n in zip([*map(_le, hist["buckets_ms"]), "+Inf"], hist["counts"], strict=True):
            total += n
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {total}')
        lines.append(f"{name}_sum{{{labels}}} {hist['sum_ns'] // 1_000_000}")  # whole ms, as Triton's
        lines.append(f"{name}_count{{{labels}}} {total}")


def _render_summaries(lines: list[str], model_stats: list[dict[str, Any]], latency: dict[str, Any]) -> None:
    rows = [(s, latency[_id(s)]["summaries"]) for s in model_stats
            if "summaries" in latency.get(_id(s), {})]
    if not rows:
        return
    for name, help_text, kind in _SUMMARIES:
        present = [(s, summaries[kind]) for s, summaries in rows if kind in summaries]
        if not present:
            continue  # the cache summaries exist only for models with a response cache, as in Triton
        _header(lines, name, help_text, "summary")
        for s, doc in present:
            for q, ns in doc["quantiles"].items():
                lines.append(f'{name}{{{_labels(s)},quantile="{q}"}} {ns // 1000}')
            lines.append(f"{name}_sum{{{_labels(s)}}} {doc['sum_ns'] // 1000}")
            lines.append(f"{name}_count{{{_labels(s)}}} {doc['count']}")


def _render_histograms(lines: list[str], model_stats: list[dict[str, Any]], latency: dict[str, Any]) -> None:
    for name, help_text, kind in _HISTOGRAMS:
        _header(lines, name, help_text, "histogram")
        for s in model_stats:
            hist = latency.get(_id(s), {}).get(kind)
            if hist is None:
                continue
            labels = _labels(s)
            total = 0
            for le, n in zip(_LE, hist["counts"], strict=True):
                total += n  # Prometheus buckets are cumulative
                lines.append(f'{name}_bucket{{{labels},le="{le}"}} {total}')
            lines.append(f"{name}_sum{{{labels}}} {hist['sum_ns'] / 1e9!r}")
            lines.append(f"{name}_count{{{labels}}} {total}")


_CUSTOM_KINDS = ("counter", "gauge", "histogram")


def _render_custom(lines: list[str], families: list[dict[str, Any]]) -> None:
    for family in families:
        name, kind = family["name"], _CUSTOM_KINDS[family["kind"]]
        help_text = family["description"].replace("\\", "\\\\").replace("\n", "\\n")
        _header(lines, name, help_text, kind)
        for series in family["series"]:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(series["labels"].items()))
            if kind != "histogram":
                lines.append(f"{name}{{{labels}}} {_number(series['value'])}")
                continue
            sep = "," if labels else ""
            total = 0
            for le, n in zip([*series["buckets"], float("inf")], series["counts"], strict=True):
                total += n
                lines.append(f'{name}_bucket{{{labels}{sep}le="{_number(le)}"}} {total}')
            lines.append(f"{name}_sum{{{labels}}} {_number(series['value'])}")
            lines.append(f"{name}_count{{{labels}}} {total}")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    value = float(value)
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)
