"""``GET :8002/metrics``, run as ``ingress --protocol metrics``.

Per-model figures come from the router (``ingress/prometheus.py`` renders them);
CPU and GPU figures are sampled here every ``--metrics-interval-ms``
(``ingress/system_metrics.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import falcon
import falcon.asgi

from conveyor.ingress.context import IngressContext
from conveyor.ingress.http.errors import render_error
from conveyor.ingress.http.restricted import RestrictedApis
from conveyor.ingress.prometheus import render
from conveyor.ingress.restricted import Restriction
from conveyor.ingress.system_metrics import CpuSampler, GpuSampler


@dataclass(frozen=True)
class MetricsOptions:
    """Triton's flags: --allow-cpu-metrics, --allow-gpu-metrics, --metrics-interval-ms,
    --metrics-config counter_latencies=<bool>."""

    allow_cpu: bool = True
    allow_gpu: bool = True
    interval_ms: int = 2000
    counter_latencies: bool = True


class MetricsResource:
    api = "metrics"  # --openai-restricted-api's category (ingress/restricted.py)

    def __init__(self, ctx: IngressContext, options: MetricsOptions) -> None:
        self._link = ctx.link
        self._options = options
        self._cpu = CpuSampler() if options.allow_cpu else None
        self._gpu = GpuSampler.open() if options.allow_gpu else None
        self._sampler: asyncio.Task[None] | None = None

    async def _sample_forever(self) -> None:
        while True:
            for sampler in (self._cpu, self._gpu):
                if sampler is not None:
                    await asyncio.to_thread(sampler.sample)
            await asyncio.sleep(self._options.interval_ms / 1000)

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if self._sampler is None and (self._cpu or self._gpu):
            # Started on the first scrape: the app is built before the event loop runs.
            self._sampler = asyncio.get_running_loop().create_task(self._sample_forever())
        snapshot = await self._link.metrics()
        text = render(snapshot, counter_latencies=self._options.counter_latencies)
        extra = (self._cpu.render() if self._cpu else []) + (self._gpu.render() if self._gpu else [])
        resp.content_type = "text/plain; version=0.0.4; charset=utf-8"
        resp.text = text + "".join(line + "\n" for line in extra)


def build_metrics_app(ctx: IngressContext, options: MetricsOptions | None = None,
                      restricted: dict[str, Restriction] | None = None) -> falcon.asgi.App:
    """The app behind ``--metrics-port``: only ``GET /metrics``; ``restricted``: the header ``metrics`` needs,
    refused as the HTTP endpoint refuses (403, Triton's words)."""
    app = falcon.asgi.App(middleware=[RestrictedApis(restricted)] if restricted else [])
    if restricted:
        app.add_error_handler(falcon.HTTPError, render_error)
    app.add_route("/metrics", MetricsResource(ctx, options or MetricsOptions()))
    return app
