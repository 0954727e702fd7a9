"""Prometheus text for ``GET :8002/metrics``, with Triton's metric names and labels."""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi

from conveyor.ingress.context import IngressContext

# (metric, help, type, how to read it from one model_stats entry)
_COUNTERS: list[tuple[str, str, str]] = [
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes", "success.count"),
    ("nv_inference_count", "Number of inferences performed (a batch of n counts n)", "inference_count"),
    ("nv_inference_exec_count", "Number of model executions performed", "execution_count"),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds", "success.us"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds", "queue.us"),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     "compute_input.us"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     "compute_infer.us"),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     "compute_output.us"),
    ("nv_cache_num_hits_per_model", "Number of response cache hits per model", "cache_hit.count"),
    ("nv_cache_num_misses_per_model", "Number of response cache misses per model", "cache_miss.count"),
    ("nv_cache_hit_duration_per_model", "Total cache hit lookup duration per model, in microseconds",
     "cache_hit.us"),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     "cache_miss.us"),
]


def _value(stats: dict[str, Any], path: str) -> int:
    if "." not in path:
        return int(stats[path])
    key, unit = path.split(".")
    d = stats["inference_stats"][key]
    return int(d["count"]) if unit == "count" else int(d["ns"]) // 1000


def render(model_stats: list[dict[str, Any]], pending: dict[str, int]) -> str:
    """``model_stats`` as the statistics extension returns it; ``pending`` maps
    "model:version" to requests waiting in the router's queue."""
    lines: list[str] = []
    for name, help_text, path in _COUNTERS:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} counter")
        for s in model_stats:
            lines.append(f'{name}{{model="{s["name"]}",version="{s["version"]}"}} {_value(s, path)}')
    lines.append("# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes")
    lines.append("# TYPE nv_inference_request_failure counter")
    for s in model_stats:
        labels = f'model="{s["name"]}",reason="OTHER",version="{s["version"]}"'
        lines.append(f"nv_inference_request_failure{{{labels}}} {_value(s, 'fail.count')}")
    lines.append("# HELP nv_inference_pending_request_count Number of requests waiting in the queue")
    lines.append("# TYPE nv_inference_pending_request_count gauge")
    for s in model_stats:
        depth = pending.get(f'{s["name"]}:{s["version"]}', 0)
        lines.append(f'nv_inference_pending_request_count{{model="{s["name"]}",version="{s["version"]}"}} {depth}')
    return "\n".join(lines) + "\n"


class MetricsResource:
    def __init__(self, ctx: IngressContext) -> None:
        self._link = ctx.link

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        snapshot = await self._link.control("metrics")
        resp.content_type = "text/plain; version=0.0.4; charset=utf-8"
        resp.text = render(snapshot["model_stats"], snapshot["pending"])


def build_metrics_app(ctx: IngressContext) -> falcon.asgi.App:
    """The app behind ``--metrics-port``: only ``GET /metrics``."""
    app = falcon.asgi.App()
    app.add_route("/metrics", MetricsResource(ctx))
    return app
