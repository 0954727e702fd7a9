"""Overload refused in time: per model version, a limit on the requests waiting for it and on its
engine's KV-cache use, past which a new request is refused at once (UNAVAILABLE, HTTP 503 with
``Retry-After``) instead of waiting without bound.

    parameters { key: "MAX_WAITING_REQUESTS" value { string_value: "16" } }   # unset: no limit
    parameters { key: "MAX_KV_CACHE_USAGE"   value { string_value: "0.9" } }  # (0, 1]; unset: no limit

*Waiting* counts a request from its admission until the model answers it: queued in the router,
then sent to a worker and unanswered. A decoupled model's request (a vLLM engine's) stops waiting
at its first response: the engine is running it, and it holds no place in its queue any more. A
model that answers once counts its running requests too (for vLLM, a request that does not stream
until its whole text: set the limit with that in mind). This is the router's own bookkeeping,
exact at once, where the engine's ``num_requests_waiting`` reaches the router at most every 0.1 s:
a burst of 200 would all be in before the first report said so.

Each check is O(1) on counters (the router's loop never waits, ARCHITECTURE.md): ``Waiting.count``
moves by one on admission and once more when the request stops waiting (``release``: answered, its
first response, expired, cancelled, failed, its worker lost; the ``Ledger`` and the dispatcher call
it where a ``Pending`` leaves). The KV-cache use is the value its engines last reported
(``proto.messages.KV_USAGE_FAMILY``, one of the custom-metric series the workers send): read, not
computed, per request.

A version's ``Waiting`` lives in the registry's ``WaitingBook`` by (model, version), not in its
entry: a reload (the repository's load with a ``config``, how the limits change at run time) builds
a new entry while the old one finishes its queue, and both count into one number. So the new limit
sees every request still waiting, nothing is dropped, and the refusals counter goes on across
reloads as a Prometheus counter must.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conveyor.proto import messages as m
from conveyor.proto import migration
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_text
from conveyor.proto.errors import ConveyorError, request_prefix, unavailable
from conveyor.proto.metric_series import OVERLOAD_REASONS, OverloadReason
from conveyor.router.spec import engine_placement
from conveyor.router.spec.namespaces import name_of
from conveyor.router.spec.overload import MAX_KV_PARAMETER, MAX_WAITING_PARAMETER, overload_problem

if TYPE_CHECKING:
    from conveyor.router.pending import Pending

# What a reload applies in place, engines and requests left as they are (``limits_only_change``).
# MAX_MIGRATIONS is the ingresses' to read (proto/migration.py): nothing in the router or worker holds it.
IN_PLACE_PARAMETERS = (MAX_WAITING_PARAMETER, MAX_KV_PARAMETER, engine_placement.PARAMETER, migration.PARAMETER)


@dataclass(frozen=True, slots=True)
class OverloadLimits:
    """One version's limits, read from its config (``overload_problem`` refused bad values at load)."""

    max_waiting: int = 0  # 0: no limit
    max_kv_usage: float = 0.0  # 0: no limit; else refused once the engines' use is at least this
    # Either limit set: the one test admission makes per request (a field, not a property: no call).
    any: bool = field(init=False, default=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "any", bool(self.max_waiting or self.max_kv_usage))

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> OverloadLimits:
        if overload_problem(config):
            return cls()
        waiting = parameter_text(config, MAX_WAITING_PARAMETER)
        kv = parameter_text(config, MAX_KV_PARAMETER)
        return cls(int(waiting) if waiting else 0, float(kv) if kv else 0.0)


def limits_only_change(old: mc.ModelConfig, new: mc.ModelConfig) -> bool:
    """``new`` is ``old`` but for these limits, ``ENGINE_PLACEMENT`` or ``MAX_MIGRATIONS`` (and differs in
    them): a reload may then apply them in place (``router/lifecycle/loads.py``) instead of loading new instances, which
    for a vLLM engine means minutes and a second engine's memory beside the first's."""
    if old == new:
        return False
    stripped = []
    for config in (old, new):
        copy = mc.ModelConfig()
        copy.CopyFrom(config)
        for key in IN_PLACE_PARAMETERS:
            if key in copy.parameters:
                del copy.parameters[key]
        stripped.append(copy)
    return stripped[0] == stripped[1]


class Waiting:
    """The requests waiting for one model version, its engines' KV-cache use, and its refusals."""

    __slots__ = ("_kv_by_worker", "count", "kv_usage", "refusals", "running")

    def __init__(self) -> None:
        self.count = 0
        # Requests on its workers and not finally answered (the Ledger's ``started`` to ``returned`` or
        # ``closed``). The KV-cache report counts only while there is one: an engine reports with its
        # steps, and one that went idle (the last request aborted, its blocks freed) reports no more,
        # so its last figure would otherwise refuse every request for ever.
        self.running = 0
        # The lowest use its engines last reported (a request may still go to the least full one);
        # 0 while none reports (no vLLM engine, or its statistics off): the KV limit then never refuses.
        self.kv_usage = 0.0
        self.refusals = dict.fromkeys(OVERLOAD_REASONS, 0)
        self._kv_by_worker: dict[bytes, float] = {}

    def refusal(self, limits: OverloadLimits, req: m.InferRequest, model: str) -> ConveyorError | None:
        """The answer to a new request when the version is past a limit (counted), else None."""
        if limits.max_waiting and self.count >= limits.max_waiting:
            self.refusals[OverloadReason.WAITING.value] += 1
            # Triton's queue-full wording (PriorityQueue::PolicyQueue::Enqueue), naming the limit.
            return unavailable(
                f"{request_prefix(req.request_id)}Exceeds maximum waiting requests: {self.count} requests already "
                f"wait for model '{name_of(model)}' (parameter {MAX_WAITING_PARAMETER} {limits.max_waiting})"
            )
        if limits.max_kv_usage and self.running and self.kv_usage >= limits.max_kv_usage:
            self.refusals[OverloadReason.KV_CACHE.value] += 1
            return unavailable(
                f"{request_prefix(req.request_id)}Exceeds maximum KV-cache usage: {self.kv_usage:.0%} of the "
                f"KV cache of model '{name_of(model)}' is in use "
                f"(parameter {MAX_KV_PARAMETER} {limits.max_kv_usage:g})"
            )
        return None

    def add(self, item: Pending) -> None:
        """``item`` was admitted: it waits until ``release``."""
        self.count += 1
        item.waits = self

    def kv_reported(self, worker: bytes, usage: float) -> None:
        self._kv_by_worker[worker] = usage
        self.kv_usage = min(self._kv_by_worker.values())

    def forget(self, worker: bytes) -> None:
        if self._kv_by_worker.pop(worker, None) is not None:
            self.kv_usage = min(self._kv_by_worker.values(), default=0.0)


def release(item: Pending) -> None:
    """``item`` no longer waits (answered, first response, expired, cancelled, failed); idempotent."""
    waits = item.waits
    if waits is not None:
        item.waits = None
        waits.count -= 1


class WaitingBook:
    """Every model version's ``Waiting``, by (registry key, version), kept across reloads and
    unloads (a few counters per version the repository ever served)."""

    def __init__(self) -> None:
        self._by_version: dict[tuple[str, int], Waiting] = {}

    def of(self, key: str, version: int) -> Waiting:
        found = self._by_version.get((key, version))
        if found is None:
            found = self._by_version[(key, version)] = Waiting()
        return found

    def kv_reported(self, worker: bytes, metrics: list[m.CustomMetric]) -> None:
        """A worker's custom metrics: the KV-cache use of its engines, by the ``model`` and
        ``version`` labels (the model's name: with --model-namespacing every key of that name)."""
        for metric in metrics:
            if metric.family != m.KV_USAGE_FAMILY:
                continue
            name, version = metric.labels.get("model", ""), metric.labels.get("version", "")
            if not version.isdigit():
                continue
            for waiting in self._named(name, int(version)):
                if metric.removed:
                    waiting.forget(worker)
                else:
                    waiting.kv_reported(worker, metric.value)

    def forget(self, worker: bytes) -> None:
        """A worker is gone: its engines' reports with it."""
        for waiting in self._by_version.values():
            waiting.forget(worker)

    def _named(self, name: str, version: int) -> list[Waiting]:
        found = self._by_version.get((name, version))
        if found is not None:
            return [found]
        return [w for (key, v), w in self._by_version.items() if v == version and name_of(key) == name]
