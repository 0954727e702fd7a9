"""The router's view of every model version: its config, state, queue, instances
and statistics, built from its spec; what the ingress is told about it (``signature``,
``metadata``). The registry of them by name is ``registry.py``."""

from __future__ import annotations

import enum
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor.proto import migration
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_text
from conveyor.proto.datatypes import config_to_datatype
from conveyor.proto.errors import invalid_arg
from conveyor.proto.sequence_config import SequenceConfig, sequence_batched
from conveyor.proto.signature import ModelSignature
from conveyor.router.observability.histograms import (
    HistogramConfig,
    LatencyMetrics,
    first_response_buckets_ms,
    uncustomizable_families,
)
from conveyor.router.observability.stats import ModelStats
from conveyor.router.pending import equal_shapes
from conveyor.router.scheduling.adaptive import AdaptiveBatcher, latency_target_ns
from conveyor.router.scheduling.batcher import DynamicBatcher
from conveyor.router.scheduling.delay_hooks import backlog_held_until, held_until
from conveyor.router.scheduling.engine_placement import EnginePlacement
from conveyor.router.scheduling.ordering import ResponseOrder
from conveyor.router.scheduling.overload import OverloadLimits, Waiting
from conveyor.router.scheduling.queue_policy import DEFAULT_QUEUE_CAP, SchedulingPolicy
from conveyor.router.scheduling.sequences import SequenceBatcher
from conveyor.router.scheduling.shape_keys import BatchKey, batch_key, unbatched
from conveyor.router.spec.model_spec import ModelSpec
from conveyor.router.spec.namespaces import name_of
from conveyor.router.spec.triton_rules import default_count

UNLOADED = "unloaded"  # a version's reason once unloaded, as Triton's index shows it

log = logging.getLogger(__name__)


class InstanceState(enum.Enum):
    UNPLACED = "UNPLACED"
    LOADING = "LOADING"
    READY = "READY"
    FAILED = "FAILED"
    # On a worker that is leaving: takes no new batch, goes when its worker goes.
    DRAINING = "DRAINING"


@dataclass(eq=False)
class Instance:
    """One copy of a model version, hosted by one worker."""

    version: VersionState
    index: int
    device: str  # what the config asks: "cpu", "cuda:N", or "cuda" (any GPU: KIND_GPU without gpus)
    state: InstanceState = InstanceState.UNPLACED
    worker: bytes | None = None
    running: int = 0  # batches sent to its worker and not answered yet (see VersionState.pipeline_depth)
    # An engine's load (engine placement): requests sent to it and not finally answered (a decoupled
    # one: until its final response), and the prompt blocks it has yet to compute for them (each
    # request's until its first response).
    open_requests: int = 0
    prefill_blocks: int = 0
    error: str = ""
    placed_device: str = ""  # for "cuda": the GPU placement chose
    load_attempts: int = 0  # failed loads so far (--model-load-retry-count)
    lost_loading: int = 0  # workers lost while loading it (worker_pool/membership.py)
    user_ready: bool = False  # its model decides its readiness (router/user_readiness.py)
    reports_evictions: bool = False  # its engine says what its cache evicts (engine placement)
    # Triton's instance name, <group name>_<index in the group> (instance_names); models see it
    # (a Python model's args["model_instance_name"]) and error messages name it.
    name: str = ""
    # Its group's settings but name and count (Triton's InstanceConfigSignature), once an instance update
    # has matched it (router/lifecycle/instance_update.py); b"": not yet, its place in the config says.
    signature: bytes = b""

    @property
    def busy(self) -> bool:
        """A batch of it is on its worker."""
        return self.running > 0

    @property
    def load_device(self) -> str:
        """The concrete device the instance loads on."""
        return self.placed_device or self.device

    @property
    def serving(self) -> bool:
        """Loaded on a worker and taking batches."""
        return self.state is InstanceState.READY and self.worker is not None


# A vLLM model's execute only hands each request to its engine, which batches every iteration over
# all it holds: the router forwards requests at once, up to this many batches in flight per instance.
ENGINE_IN_FLIGHT = 1 << 16
# A model without dynamic batching: batches an instance may hold, and how many once DEEP_IN_FLIGHT
# requests per instance are queued or running (VersionState.deep_pipeline_depth).
PIPELINE_DEPTH = 2
DEEP_PIPELINE_DEPTH = 4
DEEP_IN_FLIGHT = 6


@dataclass(eq=False)
class VersionState:
    model: str
    version: int
    path: str
    config: mc.ModelConfig
    stats: ModelStats
    batcher: DynamicBatcher | SequenceBatcher  # the latter for models with sequence_batching
    instances: list[Instance] = field(default_factory=list)
    error: str = ""
    # No instance_group in the config: one CPU instance on every worker, added
    # and removed as workers come and go (or one on every GPU: router/repository/default_groups.py).
    per_worker: bool = False
    # The GPUs a default or KIND_AUTO group was given when first placed ([]: CPU); None: not yet.
    auto_gpus: list[int] | None = None
    order: ResponseOrder | None = None  # dynamic_batching.preserve_ordering
    latency: LatencyMetrics = field(default_factory=LatencyMetrics)  # histograms for /metrics
    # Which requests may share a batch (router/scheduling/shape_keys.py); may refuse a request (INVALID_ARG).
    batch_key: BatchKey = field(default=unbatched)
    # nv_model_load_duration_secs: from the load's start until every instance first reported
    # ready (Triton: until the version is loaded); 0 while that has not happened.
    load_started_ns: int = field(default_factory=time.monotonic_ns)
    load_duration_ns: int = 0
    # How many batches an instance may hold at once. A model without dynamic batching never grows
    # a batch by waiting, so its next request goes to the worker while the current one runs:
    # the instance starts it as soon as it is free, without waiting for the router (2). Batching,
    # sequence and decoupled models wait until an instance is free (1), as in Triton.
    pipeline_depth: int = 1  # ENGINE_IN_FLIGHT for a model whose engine batches in flight (vLLM)
    # The same while at least DEEP_IN_FLIGHT requests per instance are queued or running: the worker
    # then gets more at once and answers them in one message (docs/PERFORMANCE.md, "A deeper pipeline
    # under load"). Not with fewer: a few requests sent to the worker together come back together,
    # and then move in lock step through the actors, which take turns instead of overlapping.
    deep_pipeline_depth: int = 1
    # --model-namespacing: its repository, Triton's ``namespace`` metrics label ("" without it).
    namespace: str = ""
    # MAX_WAITING_REQUESTS, MAX_KV_CACHE_USAGE (router/scheduling/overload.py), and what they are checked
    # against: the registry's one count for this model version, shared with its reloads.
    limits: OverloadLimits = field(default_factory=OverloadLimits)
    waiting: Waiting = field(default_factory=Waiting)
    # A vLLM model's choice among its engines (ENGINE_PLACEMENT); None: the first free instance.
    placement: EnginePlacement | None = None
    # Requests sent again after the worker running them exited (proto/migration.py), counted as they
    # arrive: conveyor_request_migrations_total.
    migrations: int = 0
    # The version as requests and statistics name it (``str(version)``), made once: the request path
    # names it in every reply and batch.
    label: str = field(init=False, default="")
    # ``decoupled``, read once from the config (``_version_state``): each batch the dispatcher sends asks.
    runs_decoupled: bool = False
    # What an ensemble's step request to this version is checked against (``Admission``), made at the first.
    step_signature: ModelSignature | None = None

    def __post_init__(self) -> None:
        self.label = str(self.version)

    @property
    def decoupled(self) -> bool:
        return self.config.model_transaction_policy.decoupled

    @property
    def ready(self) -> bool:
        if self.error:
            return False
        for inst in self.instances:  # a plain loop: asked for every request (no generator made)
            if inst.state is InstanceState.READY:
                return True
        return False

    @property
    def state(self) -> str:
        if self.ready:
            return "READY"
        if self.error or (self.instances and all(_hopeless(i) for i in self.instances)):
            return "UNAVAILABLE"
        return "LOADING"

    @property
    def reason(self) -> str:
        if self.error:
            return self.error
        failed = [i.error for i in self.instances if _hopeless(i)]
        if failed and not self.ready:
            return failed[0]
        if not self.ready:
            return "waiting for a worker to load it"
        return ""


def _hopeless(inst: Instance) -> bool:
    """Failed to load, or no worker can host it (until one with its device joins)."""
    return inst.state is InstanceState.FAILED or (inst.state is InstanceState.UNPLACED and bool(inst.error))


@dataclass(eq=False)
class ModelEntry:
    spec: ModelSpec
    versions: dict[int, VersionState] = field(default_factory=dict)


def build_entry(
    spec: ModelSpec, queue_cap: int = DEFAULT_QUEUE_CAP, next_index: Callable[[], int] | None = None,
    slot_padding: bool = False,
) -> ModelEntry:
    """``next_index`` numbers instances: unique per router, so a reloaded model's new
    instances never collide with the old ones still finishing on the same worker. ``slot_padding``:
    ``--sequence-slot-padding``."""
    entry = ModelEntry(spec)
    config = spec.config
    number = next_index or itertools.count().__next__
    key = spec.registry_key
    for v, path in sorted(spec.versions.items()):
        entry.versions[v] = _version_state(key, v, path, config, queue_cap, number, spec.name, slot_padding)
    for v, err in spec.version_errors.items():
        state = _version_state(key, v, "", config, queue_cap, number, spec.name, slot_padding)
        state.error = err
        entry.versions[v] = state
    return entry


def without_shared(entry: ModelEntry, other: ModelEntry | None) -> ModelEntry:
    """``entry`` less the versions it shares with ``other`` (a reload kept them: they are ``other``'s now), to
    retire: what the two share keeps serving."""
    if other is None or not any(other.versions.get(v) is s for v, s in entry.versions.items()):
        return entry
    return ModelEntry(entry.spec, {v: s for v, s in entry.versions.items() if other.versions.get(v) is not s})


def add_dropped_versions(entry: ModelEntry, old: ModelEntry, queue_cap: int, next_index: Callable[[], int]) -> None:
    """The versions ``old`` served that its reload ``entry`` lacks (gone from the repository or the version
    policy), recorded UNAVAILABLE "unloaded" as Triton keeps them: a request naming one is told it is not at
    ready state rather than not found, and the index lists it."""
    if entry.spec.backend == "ensemble":
        return
    for v, state in old.versions.items():
        if v in entry.versions or not state.ready:
            continue
        dropped = _version_state(entry.spec.registry_key, v, "", entry.spec.config, queue_cap, next_index,
                                 entry.spec.name)
        dropped.error, dropped.instances = UNLOADED, []
        entry.versions[v] = dropped


def _version_state(
    name: str, v: int, path: str, config: mc.ModelConfig, queue_cap: int, next_index: Callable[[], int],
    shown: str, slot_padding: bool = False,
) -> VersionState:
    """``name``: the registry key; ``shown``: the model's name, which statistics report."""
    db = config.dynamic_batching
    policy = SchedulingPolicy.from_config(config)
    target_ns = latency_target_ns(config) if config.max_batch_size > 0 and config.HasField("dynamic_batching") else 0
    batcher: DynamicBatcher | SequenceBatcher
    if sequence_batched(config):
        batcher = SequenceBatcher(name, SequenceConfig.from_config(config), queue_cap, slot_padding)
    elif target_ns:
        batcher = AdaptiveBatcher(config.max_batch_size, target_ns, policy, queue_cap)
    else:
        batcher = DynamicBatcher(
            config.max_batch_size,
            list(db.preferred_batch_size),
            db.max_queue_delay_microseconds * 1000,
            enabled=config.HasField("dynamic_batching"),
            policy=policy,
            queue_cap=queue_cap,
        )
    batcher.held_until = held_until(shown)
    if isinstance(batcher, SequenceBatcher) and batcher.held_until:
        batcher.backlog_held_until = backlog_held_until(shown)
    state = VersionState(name, v, path, config, ModelStats(shown, str(v)), batcher)
    state.batch_key = batch_key(config, name)
    if state.batch_key is equal_shapes and isinstance(batcher, DynamicBatcher) and not batcher.enabled:
        state.batch_key = unbatched  # each request is a batch of its own: no key is ever compared
    state.limits = OverloadLimits.from_config(config)
    decoupled, cached = config.model_transaction_policy.decoupled, config.response_cache.enable
    state.runs_decoupled = decoupled
    for family in uncustomizable_families(config.model_metrics):
        log.warning("Metric family '%s' in 'metric_identifier' is not a customizable metric in Triton core.", family)
    if decoupled or cached or HistogramConfig.every_model:
        first = decoupled or HistogramConfig.every_model  # every model's when asked, as Triton's
        state.latency = LatencyMetrics(first_response_buckets_ms(config.model_metrics) if first else None, cached)
    state.instances = [
        Instance(state, next_index(), dev, name=name)
        for dev, name in zip(instance_devices(config), instance_names(config), strict=True)
    ]
    state.per_worker = not config.instance_group
    if db.preserve_ordering:
        state.order = ResponseOrder()
    if not (config.HasField("dynamic_batching") or config.HasField("sequence_batching") or decoupled):
        state.pipeline_depth, state.deep_pipeline_depth = PIPELINE_DEPTH, DEEP_PIPELINE_DEPTH
    if config.backend == "vllm":
        state.pipeline_depth = state.deep_pipeline_depth = ENGINE_IN_FLIGHT
        state.placement = EnginePlacement.from_config(config)
    return state


def instance_devices(config: mc.ModelConfig) -> list[str]:
    """One device string per instance the config's ``instance_group`` asks for.

    No ``instance_group``: none here; the router then gives every worker one CPU
    instance (a Conveyor choice that uses every worker process). ``KIND_GPU``
    without ``gpus``: "cuda", any GPU, chosen at placement (Triton puts ``count``
    instances on every GPU; Conveyor places ``count`` in all, spread over the GPUs).
    """
    devices: list[str] = []
    for group in config.instance_group:
        count = group.count if group.count > 0 else default_count(group.kind, config.backend)
        if group.kind == mc.ModelInstanceGroup.KIND_GPU:
            if not group.gpus:
                devices += ["cuda"] * count
            for gpu in group.gpus:
                devices += [f"cuda:{gpu}"] * count
        elif group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            # GPU or CPU once the workers' GPUs are known (router/repository/default_groups.py).
            listed = ",".join(str(g) for g in group.gpus)
            devices += [f"auto:{g}:{listed}" for g in group.gpus for _ in range(count)] or ["auto"] * count
        else:
            devices += ["cpu"] * count
    return devices


def instance_names(config: mc.ModelConfig) -> list[str]:
    """Triton's name of each instance ``instance_devices`` lists, in its order:
    ``<group>_<i>``, the group being named by its ``name`` or ``<model>_<group index>``
    (core's model_config_utils and backend_model.cc); the instances of one ``i`` on
    several GPUs share it, as in Triton."""
    names: list[str] = []
    for g, group in enumerate(config.instance_group):
        count = group.count if group.count > 0 else default_count(group.kind, config.backend)
        prefix = group.name or f"{config.name}_{g}"
        on_gpus = group.kind in (mc.ModelInstanceGroup.KIND_GPU, mc.ModelInstanceGroup.KIND_AUTO)
        copies = len(group.gpus) if on_gpus and group.gpus else 1  # instance_devices: count per listed GPU
        names += [f"{prefix}_{i}" for _ in range(copies) for i in range(count)]
    return names


def default_instance_name(state: VersionState) -> str:
    """The name of a new instance of a model without ``instance_group``. Triton gives such a
    config one group named after the model (``<model>_0`` is its first instance); Conveyor
    puts one instance of it on each worker: the first index no instance of the version has."""
    taken = {inst.name for inst in state.instances}
    i = 0
    while f"{state.config.name}_{i}" in taken:
        i += 1
    return f"{state.config.name}_{i}"


def parse_version(version: str) -> int:
    """A request's version string as a number (-1: none given), in Triton's words when it is not one."""
    if not version:
        return -1
    try:
        number = int(version)
    except ValueError:
        raise invalid_arg(
            f"failed to get model version from specified version string '{version}' (details: stol), "
            "version should be an integral value > 0"
        ) from None
    if number < 0:
        raise invalid_arg(
            f"invalid model version specified '{version}' , version should be an integral value > 0"
        )
    return number


def signature(state: VersionState) -> dict[str, Any]:
    """What the ingress needs to validate requests for this version."""
    config = state.config

    def tensors(items: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "datatype": config_to_datatype(mc.DataType.Name(t.data_type)),
                "dims": list(t.dims),
                "optional": bool(getattr(t, "optional", False)),
            }
            for t in items
        ]

    return {
        "name": name_of(state.model),  # a --model-namespacing key is no name to show
        "max_batch_size": config.max_batch_size,
        "inputs": tensors(config.input),
        "outputs": tensors(config.output),
        "decoupled": config.model_transaction_policy.decoupled,
        # Not streamed (``stream`` false or absent), a vLLM model answers once: plain infer serves it.
        "plain_infer": config.backend == "vllm",
        # Even under round_robin: ENGINE_PLACEMENT may change in place, without a new signature.
        "prefix_placed": state.placement is not None,
        # How often a request moves when its worker dies (ingress/migration.py): a vLLM model's, which
        # returns the token ids a resumed prompt is made of and takes them as ``input_ids``; 0 for others.
        "max_migrations": max_migrations(config),
    }


def max_migrations(config: mc.ModelConfig) -> int:
    """``MAX_MIGRATIONS`` of a vLLM model with an ``input_ids`` input; 0 for any other model."""
    if config.backend != "vllm" or not any(t.name == "input_ids" for t in config.input):
        return 0
    return max(0, migration.max_migrations_of(parameter_text(config, migration.PARAMETER)))


def metadata(entry: ModelEntry, state: VersionState | None) -> dict[str, Any]:
    """KServe model metadata (``GET /v2/models/{m}[/versions/{v}]``)."""
    config = entry.spec.config
    batch = [-1] if config.max_batch_size > 0 else []

    def tensors(items: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "datatype": config_to_datatype(mc.DataType.Name(t.data_type)),
                "shape": batch + list(t.dims),
            }
            for t in items
        ]

    versions = [state.label] if state is not None else [
        s.label for s in sorted(entry.versions.values(), key=lambda s: s.version) if s.ready
    ]
    return {
        "name": entry.spec.name,
        "versions": versions,
        "platform": config.platform or config.backend,
        "inputs": tensors(config.input),
        "outputs": tensors(config.output),
        "decoupled": config.model_transaction_policy.decoupled,
    }
