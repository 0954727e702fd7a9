"""Answers to the ingress's control calls (metadata, readiness, config, statistics); every
op the router answers is listed in ``control_ops.py``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from conveyor.deploy.runtime.drain import DrainClock
from conveyor.proto.errors import ConveyorError, Status, invalid_arg
from conveyor.proto.model_config import to_json
from conveyor.router.ensembles.state import EnsembleVersion
from conveyor.router.models import ENGINE_IN_FLIGHT, UNLOADED, VersionState, metadata, parse_version, signature
from conveyor.router.observability.custom_metrics import CustomMetricsStore
from conveyor.router.pool import WorkerPool
from conveyor.router.registry import ModelRegistry
from conveyor.router.repository.default_groups import filled_config


class ControlHandler:
    def __init__(self, registry: ModelRegistry, pool: WorkerPool, shutdown: DrainClock | None = None) -> None:
        self.registry = registry
        self.pool = pool
        self.shutdown = shutdown or DrainClock()
        self.boot_id = time.time_ns()
        self.custom_metrics = CustomMetricsStore()  # models' pb_utils.MetricFamily series, from the workers
        self.response_cache = False  # the server has a response cache (--cache-config)
        self.strict_readiness = False  # --strict-readiness
        self.starting: Callable[[], bool] = lambda: False  # start-up's loads not all settled yet
        # The server failed to initialize (a repository root it cannot use, --exit-on-error=false): Triton's
        # SERVER_FAILED_TO_INITIALIZE, never ready, every model call refused (``check_initialized``).
        self.failed = False
        # OpenTelemetry mode: spans exported, dropped and failed (router/observability/otlp_export.py).
        self.trace_export: Callable[[], dict[str, int] | None] = lambda: None
        # gRPC ingress links (identity) whose ngh2 engine failed its self-test, serving on h2 (their hello says so).
        self.ngh2_failures: set[bytes] = set()

    def check_initialized(self) -> None:
        """Triton's answer to a model call of a server that failed to initialize."""
        if self.failed:
            raise ConveyorError(Status.UNAVAILABLE, "Server not ready")

    def ping(self) -> list[int]:
        """This router's boot id (a change tells the ingress the router restarted) and its pid
        (while the process lives, a late answer is a busy router, not a lost one)."""
        return [self.boot_id, os.getpid()]

    def server_ready(self) -> bool:
        """Ready once every loadable model version has settled (ready or failed).

        By default a model that failed to load does not hold the server back: it
        reports its own reason on its own endpoints. With --strict-readiness (Triton's
        default, and ``tritonserver``'s) every model must be ready, as in Triton.
        A draining router is not ready, so every ingress says so at once; nor is one whose
        start-up loads are still being prepared.
        """
        if self.shutdown.draining or self.starting() or self.failed:
            return False
        versions = self.registry.versions()
        if versions and not self.pool.workers:
            return False
        if self.strict_readiness:
            if any(entry.spec.error for entry in self.registry.models.values()):
                return False
            # As Triton: a version that is not ready because it was unloaded does not count.
            return all(v.state == "READY" or v.error == UNLOADED for v in versions)
        return all(v.state != "LOADING" for v in versions)

    def model_ready(self, model: str, version: str = "") -> bool:
        parse_version(version)  # a version string that is no number: Triton's 400, first
        try:
            self.registry.resolve(model, version)
        except Exception:
            return False
        return True

    def model_load(self, model: str, version: str = "") -> dict[str, float]:
        """What a version holds now, as the load report a gateway reads (the OpenAI ingress's
        ``endpoint-load-metrics`` header): the counts the overload limits read (router/scheduling/overload.py)."""
        waiting = self.registry.resolve(model, version).waiting
        return {"kv_cache_usage_perc": waiting.kv_usage if waiting.running else 0.0,
                "num_requests_waiting": float(waiting.count), "num_requests_running": float(waiting.running)}

    def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        state = self.registry.resolve(model, version)
        return metadata(self.registry.entry(model), state if version else None)

    def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        parse_version(version)  # a version string that is no number: Triton's 400, first
        entry = self.registry.entry(model)
        if version:
            self.registry.resolve(model, version)
        for state in entry.versions.values():
            if isinstance(state, EnsembleVersion):
                state.composing()  # its check says whether it is decoupled (written into the config)
        latest = entry.versions[max(entry.versions)] if entry.versions else None
        return to_json(filled_config(entry.spec.config, latest))

    def model_stats(self, model: str = "", version: str = "") -> dict[str, Any]:
        parse_version(version)  # a version string that is no number: Triton's 400, first
        if model:
            entry = self.registry.entry(model)
            if version:
                states = [self.registry.resolve(model, version)]
            else:
                states = [s for s in entry.versions.values() if s.ready]
        else:
            if version:
                raise invalid_arg("a version needs a model name")
            states = [s for s in self.registry.versions() if s.ready]
        states.sort(key=lambda s: (s.model, s.version))
        return {"model_stats": [s.stats.wire() for s in states]}

    def metrics(self) -> dict[str, Any]:
        """Statistics of every ready version, the router's queue depths and latency histograms, and
        the models' custom metrics."""
        states = sorted((s for s in self.registry.versions() if s.ready), key=lambda s: (s.model, s.version))
        doc: dict[str, Any] = {
            "model_stats": [_metric_stats(s) for s in states],
            "pending": {f"{s.model}:{s.label}": _pending(s) for s in states},
            "latency": {f"{s.model}:{s.label}": s.latency.wire() for s in states},
            "adaptive_delay_ns": {f"{s.model}:{s.label}": s.batcher.adaptive.delay_ns
                                  for s in states if s.batcher.adaptive is not None},
            "custom": self.custom_metrics.wire(),
            "load_duration_ns": {f"{s.model}:{s.label}": s.load_duration_ns for s in states},
            "overload": {f"{s.model}:{s.label}": {"waiting": s.waiting.count, "refusals": dict(s.waiting.refusals)}
                         for s in states},
            "migrations": {f"{s.model}:{s.label}": s.migrations for s in states},
            "prefix_evictions": {f"{s.model}:{s.label}": dict(s.placement.evictions) for s in states
                                 if s.placement is not None and s.placement.evictions},
            "session_placements": {f"{s.model}:{s.label}": {e: dict(c) for e, c in s.placement.sessions_counted.items()}
                                   for s in states if s.placement is not None and s.placement.sessions_counted},
        }
        exported = self.trace_export()
        if exported is not None:
            doc["trace_export"] = exported
        doc["ngh2_self_test_failures"] = len(self.ngh2_failures)
        return doc

    def signature(self, model: str, version: str = "") -> dict[str, Any]:
        state = self.registry.resolve(model, version)
        sig = signature(state)
        config = state.config
        # The ingress hashes the inputs of these requests only (the router keys its cache on that); an
        # ensemble's too: Triton caches its whole response (core's ensemble_scheduler.cc).
        sig["response_cache"] = self.response_cache and config.response_cache.enable and not sig["decoupled"]
        return {"generation": self.registry.generation, "signature": sig}

    def model_directory(self, model: str, version: str = "") -> dict[str, Any]:
        """The serving version's directory (``<repository>/<model>/<version>``): the OpenAI
        ingress reads a vLLM model's ``model.json`` and ``multi_lora.json`` there."""
        state = self.registry.resolve(model, version)
        path = os.path.join(self.registry.entry(model).spec.path, str(state.version))
        return {"generation": self.registry.generation, "path": path, "version": state.version}

    def instances(self) -> list[dict[str, Any]]:
        """Where every instance of every serving version is and its state (operators, tests)."""
        pids = {w.identity: w.pid for w in self.pool.workers.values()}
        return [
            {"model": s.model, "version": s.label, "index": i.index, "name": i.name, "state": i.state.value,
             "worker_pid": pids.get(i.worker, 0) if i.worker is not None else 0, "error": i.error,
             "reports_evictions": i.reports_evictions}
            for s in sorted(self.registry.versions(), key=lambda s: (s.model, s.version))
            for i in s.instances
        ]


def _pending(state: VersionState) -> int:
    """``nv_inference_pending_request_count``: requests not executing yet, as Triton counts them (its scheduler's
    queue). A model without dynamic batching also sends its next requests to an instance's worker while one runs
    (``VersionState.pipeline_depth``): those wait there, one request per batch, and are pending too. A vLLM
    engine's requests in flight run together: none of them waits."""
    waiting = len(state.batcher)
    if 1 < state.pipeline_depth < ENGINE_IN_FLIGHT:
        for inst in state.instances:
            waiting += max(inst.running - 1, 0)
    return waiting


def _metric_stats(state: VersionState) -> dict[str, Any]:
    """A version's statistics for /metrics; with --model-namespacing, Triton's ``namespace``
    label (its repository) and, for a name several repositories hold, the key its other maps use."""
    doc = state.stats.wire()
    if state.namespace:
        doc["namespace"] = state.namespace
    if os.sep in state.model:
        doc["key"] = state.model
    return doc
