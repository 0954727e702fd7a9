"""The engine's statistics as Triton's vllm_backend reports them (``vllm:`` families, labelled
``model`` and ``version``), through the worker's custom metrics (``python/pb_utils/metrics.py``), which
reach the router's ``/metrics`` like a Python model's. Also the scheduler's running and waiting
requests and the KV cache's use, as vLLM's own server names them, and, for an engine with LoRA,
``vllm:lora_requests_info``, which LoRA-aware gateways read to route by adapter."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from conveyor.proto.messages import KV_USAGE_FAMILY
from conveyor.workers.backends.python.pb_utils.metrics import Metric, MetricFamily, MetricKind

_C, _G, _H = MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM
# Triton's buckets (vllm_backend src/utils/metrics.py), from vLLM's examples.
_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
_TPOT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
_E2E = [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
_N = [1, 2, 5, 10, 20]


class KvUsageOnly:
    """The KV cache's use alone, for a model that does not report the engine's metrics
    (``REPORT_CUSTOM_METRICS``) but limits that use (``MAX_KV_CACHE_USAGE``, which reads this series)."""

    def __init__(self, labels: dict[str, str]) -> None:
        self._family = MetricFamily(KV_USAGE_FAMILY, "KV-cache usage. 1 means 100 percent usage.", _G)
        self.kv_usage = self._family.lazy_metric(labels, None)
        self._last: float | None = None

    def record(self, scheduler: Any, iteration: Any) -> None:
        if scheduler is not None and scheduler.kv_cache_usage != self._last:
            self._last = scheduler.kv_cache_usage
            self.kv_usage.set(self._last)


class EngineMetrics:
    """One model version's ``vllm:`` series; the families live as long as this object."""

    def __init__(self, labels: dict[str, str], max_model_len: int, max_lora: int | None = None) -> None:
        """``max_lora``: the engine's ``max_loras`` when it serves LoRA adapters."""
        from vllm.v1.metrics.buckets import build_1_2_5_buckets

        tokens = [float(b) for b in build_1_2_5_buckets(max_model_len)]
        self._families: list[MetricFamily] = []

        def metric(name: str, description: str, kind: MetricKind, buckets: list[float] | None = None) -> Metric:
            family = MetricFamily(name, description, kind)
            self._families.append(family)
            return family.lazy_metric(labels, buckets)  # changed at every step

        self.prompt_tokens = metric("vllm:prompt_tokens_total", "Number of prefill tokens processed.", _C)
        self.generation_tokens = metric("vllm:generation_tokens_total", "Number of generation tokens processed.", _C)
        self.ttft = metric("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                           _H, _TTFT)
        self.tpot = metric("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                           _H, _TPOT)
        self.e2e = metric("vllm:e2e_request_latency_seconds",
                          "Histogram of end to end request latency in seconds.", _H, _E2E)
        self.request_prompt = metric("vllm:request_prompt_tokens", "Number of prefill tokens processed.", _H, tokens)
        self.request_generation = metric("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                         _H, tokens)
        self.n = metric("vllm:request_params_n", "Histogram of the n request parameter.", _H, [float(b) for b in _N])
        self.running = metric("vllm:num_requests_running", "Number of requests in model execution batches.", _G)
        self.waiting = metric("vllm:num_requests_waiting", "Number of requests waiting to be processed.", _G)
        # The router refuses new requests past the model's MAX_KV_CACHE_USAGE on it (router/scheduling/overload.py).
        self.kv_usage = metric(KV_USAGE_FAMILY, "KV-cache usage. 1 means 100 percent usage.", _G)
        # What the prefix cache saved, in prompt tokens (engine placement's proof: docs/LLM.md).
        self.prefix_queries = metric("vllm:prefix_cache_queries_total",
                                     "Prefix cache queries, in terms of number of queried tokens.", _C)
        self.prefix_hits = metric("vllm:prefix_cache_hits_total",
                                  "Prefix cache hits, in terms of number of cached tokens.", _C)
        self.lora_info = LoraInfo(labels, max_lora) if max_lora is not None else None
        self._gauges: tuple[Any, ...] = ()  # running, waiting, KV-cache use as last set

    def record(self, scheduler: Any, iteration: Any) -> None:
        if scheduler is not None:
            # Gauges set when they move: each engine step reports them, mostly unchanged.
            gauges = (scheduler.num_running_reqs, scheduler.num_waiting_reqs, scheduler.kv_cache_usage)
            if gauges != self._gauges:
                running, waiting, kv_usage = self._gauges = gauges
                self.running.set(running)
                self.waiting.set(waiting)
                self.kv_usage.set(kv_usage)
            cache = scheduler.prefix_cache_stats
            if cache is not None and cache.queries:
                self.prefix_queries.increment(cache.queries)
                if cache.hits:
                    self.prefix_hits.increment(cache.hits)
            if self.lora_info is not None:
                self.lora_info.record(scheduler.running_lora_adapters, scheduler.waiting_lora_adapters)
        if iteration is None:
            return
        if iteration.num_prompt_tokens:
            self.prompt_tokens.increment(iteration.num_prompt_tokens)
        if iteration.num_generation_tokens:
            self.generation_tokens.increment(iteration.num_generation_tokens)
        # A value per token of the step: one lock each, not one per value.
        self.ttft.observe_all(iteration.time_to_first_tokens_iter)
        self.tpot.observe_all(iteration.inter_token_latencies_iter)
        self.n.observe_all(iteration.n_params_iter)
        for done in iteration.finished_requests:
            self.e2e.observe(done.e2e_latency)
            self.request_prompt.observe(done.num_prompt_tokens)
            self.request_generation.observe(done.num_generation_tokens)


LORA_INFO = "vllm:lora_requests_info"
LORA_INFO_REFRESH_S = 1.0


class LoraInfo:
    """``vllm:lora_requests_info`` as vLLM exports it: a gauge whose labels say which adapters the
    engine's running and waiting requests use (names joined by commas) and its ``max_lora``, and
    whose value is the time they were seen (a gateway reads the newest). vLLM keeps a series for each
    label set it ever saw; here only the current one is kept (the older ones would only age), so a
    family is made per label set and the previous one let go, which removes its series."""

    def __init__(self, labels: dict[str, str], max_lora: int) -> None:
        self._labels = {**labels, "max_lora": str(max_lora)}
        self._shown: tuple[str, str] | None = None
        self._family: MetricFamily | None = None
        self._metric: Metric | None = None
        self._set_at = 0.0

    def record(self, running: dict[str, int], waiting: dict[str, int]) -> None:
        seen = (",".join(running), ",".join(waiting))
        now = time.time()
        # Once a second while nothing changes: each engine step records, and the time is all that moves.
        if seen == self._shown and now - self._set_at < LORA_INFO_REFRESH_S:
            return
        if seen != self._shown or self._metric is None:
            family = MetricFamily(LORA_INFO, "Running stats on lora requests.", _G)
            # born with its time: a gateway never sees the label set at 0
            self._metric = family.lazy_metric({**self._labels, "running_lora_adapters": seen[0],
                                               "waiting_lora_adapters": seen[1]}, value=now)
            self._family, self._shown = family, seen  # the previous family goes, and its series with it
        else:
            self._metric.set(now)
        self._set_at = now


def stat_logger_factory(labels: dict[str, str], kv_only: bool = False) -> Callable[[Any, int], Any]:
    """A vLLM ``StatLoggerFactory`` whose loggers record into ``EngineMetrics`` (built on the engine's
    first call, when the model's length is known); ``kv_only``: into ``KvUsageOnly``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class ConveyorStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            lora = vllm_config.lora_config
            self.metrics: EngineMetrics | KvUsageOnly = KvUsageOnly(labels) if kv_only else EngineMetrics(
                labels, vllm_config.model_config.max_model_len, lora.max_loras if lora is not None else None)

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            self.metrics.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return ConveyorStatLogger
