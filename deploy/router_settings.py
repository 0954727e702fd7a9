"""The router's settings (``deploy/settings.py`` combines them): the repositories, scheduling, model control,
client shared memory, tracing, and the metrics it keeps (which the metrics ingress serves)."""

from __future__ import annotations

from conveyor.deploy.flag_types import (
    backend_setting,
    cache_config,
    checked,
    load_threads,
    resource_limit,
    triton_bool,
)
from conveyor.deploy.setting_types import (
    INGRESS,
    ROUTER,
    SUPERVISOR,
    Settings,
    setting,
)
from conveyor.router.scheduling.queue_policy import DEFAULT_QUEUE_CAP
from conveyor.router.shared_memory.client_regions import DEFAULT_MAX_REGIONS

_ROUTER = frozenset({ROUTER})


class Repository(Settings):
    """The repositories and backend settings: the router loads from them, the supervisor builds the example one."""

    ACTORS = frozenset({SUPERVISOR, ROUTER})
    # The router gets the repositories the supervisor serves (the example one when none is given).
    model_repository: list[str] = setting(
        ("--model-repository", "--model-store"), "a Triton model repository (repeatable)",
        default=[], repeatable=True, triton=True,
        required=_ROUTER)
    backend_config: list[str] = setting(
        ("--backend-config",), "Triton's backend settings (repeatable): default-max-batch-size, onnxruntime's "
        "intra_op_thread_count / inter_op_thread_count; others are accepted and logged",
        kind=checked(backend_setting), default=[], repeatable=True, metavar="[BACKEND,]KEY=VALUE", triton=True)


class Scheduling(Settings):
    """The router's queues, response cache and rate limiter."""

    ACTORS = _ROUTER
    cache_config: list[str] = setting(
        ("--cache-config",), "Triton's response cache: models with response_cache { enable: true } are "
        "answered from a cache of this many bytes of outputs (off by default)",
        kind=cache_config, default=[], repeatable=True, metavar="local,size=BYTES", triton=True)
    # Folded into --cache-config as it is parsed (options.fold_response_cache_size): nothing left to pass on.
    response_cache_byte_size: int | None = setting(
        ("--response-cache-byte-size",), "deprecated (Triton's): --cache-config local,size=BYTES",
        kind=int, metavar="BYTES", triton=True)
    max_queue_size: int = setting(
        ("--max-queue-size",), "requests one model version may hold queued before new ones are refused with "
        "'Exceeds maximum queue size' (503 / UNAVAILABLE), whatever its config says; 0: no cap "
        f"(default {DEFAULT_QUEUE_CAP})", kind=int, default=DEFAULT_QUEUE_CAP, metavar="N")
    sequence_slot_padding: bool = setting(
        ("--sequence-slot-padding",), "true: a direct sequence batch runs as Triton's does, one row per slot up "
        "to the highest slot in use, the empty ones as not-ready rows (READY false, zero inputs), which count "
        "in the batch-size statistics; false: only the slots that hold a request run (less compute) (default "
        "false for 'conveyor serve', true for 'tritonserver', as Triton)",
        kind=triton_bool, default=False, triton_default=True, metavar="BOOL")
    rate_limit: str = setting(
        ("--rate-limit",), "execution_count: an instance runs only when the resources its instance_group's "
        "rate_limiter lists are free (Triton's rate limiter); off: ignore rate_limiter",
        default="off", choices=("off", "execution_count"), kind=str.lower, triton=True)  # any case, as Triton
    rate_limit_resource: list[str] = setting(
        ("--rate-limit-resource",), "copies of a rate-limiter resource (repeatable; no DEVICE: on every "
        "device); by default the largest count any instance asks for",
        kind=resource_limit, default=[], repeatable=True, metavar="NAME:COUNT[:DEVICE]", triton=True)


class ModelControl(Settings):
    """What the router loads, when, and what a failed load means."""

    ACTORS = _ROUTER
    model_control_mode: str = setting(
        ("--model-control-mode",), "none: load every model at start; poll: also follow repository changes; "
        "explicit: load what --load-model names and what the load API asks for",
        default="none", choices=("none", "poll", "explicit"), kind=str.lower, triton=True)  # any case, as Triton
    repository_poll_secs: float = setting(
        ("--repository-poll-secs",), "how often poll mode rescans the repositories", kind=float, default=15.0,
        triton=True)
    load_model: list[str] = setting(
        ("--load-model",), "explicit mode: load this model at start (repeatable; '*' for every model)",
        default=[], repeatable=True, metavar="NAME", triton=True)
    strict_model_config: bool = setting(
        ("--strict-model-config",), "never complete a config from the model file: config.pbtxt must declare "
        "inputs and outputs", kind=triton_bool, default=False, metavar="BOOL", triton=True)
    disable_auto_complete_config: bool = setting(
        ("--disable-auto-complete-config",), "as --strict-model-config=true (Triton's newer name)",
        switch=True, default=False, triton=True)
    # Model Analyzer and Triton's tests expect Triton's defaults from tritonserver.
    exit_on_error: bool = setting(
        ("--exit-on-error",), "a model that fails to load at start-up stops the server with a non-zero exit "
        "code (default false for 'conveyor serve', true for 'tritonserver', as Triton)",
        kind=triton_bool, default=False, triton_default=True, metavar="BOOL", triton=True)
    strict_readiness: bool = setting(
        ("--strict-readiness",), "ready only while every model is ready (true); false: once every load has "
        "settled, failed or not (default false for 'conveyor serve', true for 'tritonserver', as Triton)",
        kind=triton_bool, default=False, triton_default=True, metavar="BOOL", triton=True)
    model_config_name: str = setting(
        ("--model-config-name",), "load <model>/configs/NAME.pbtxt where it exists instead of config.pbtxt",
        default="", metavar="NAME", triton=True)
    model_namespacing: bool = setting(
        ("--model-namespacing",), "each model repository is a namespace: several may hold a model of the same "
        "name, an ensemble uses its own repository's, a request to a name held twice is refused",
        kind=triton_bool, default=False, metavar="BOOL", triton=True)
    model_load_retry_count: int = setting(
        ("--model-load-retry-count",), "load a model instance that failed up to N more times before it counts "
        "as failed", kind=int, default=0, metavar="N", triton=True)
    model_load_thread_count: int = setting(
        ("--model-load-thread-count",), "threads the router prepares loads on (reading, completing and "
        "mirroring models): loads of different models run in parallel, and every other model keeps serving "
        "(default 4)", kind=load_threads, default=4, metavar="N", triton=True)


class ClientSharedMemory(Settings):
    """Shared-memory regions clients register (the router keeps the registry)."""

    ACTORS = _ROUTER
    # Triton 2.5x has no switch for it: tritonserver lets clients register, as Triton does.
    allow_client_shm: bool = setting(
        ("--allow-client-shm",), "let clients register system/CUDA shared-memory regions (off by default, as "
        "in Triton: a client may name any segment the server's user can open)",
        kind=triton_bool, default=False, triton_default=True, metavar="BOOL")
    max_client_shm_regions: int = setting(
        ("--max-client-shm-regions",), "shared-memory regions clients may hold registered at once; past it a "
        "registration is refused with 503 / UNAVAILABLE; 0: no limit "
        f"(default {DEFAULT_MAX_REGIONS})", kind=int, default=DEFAULT_MAX_REGIONS, metavar="N")


class Tracing(Settings):
    """Triton's tracing: the router samples and writes the traces."""

    ACTORS = _ROUTER
    trace_config: list[str] = setting(
        ("--trace-config",), "rate=N, level=OFF|TIMESTAMPS|TENSORS, count=N, mode=triton|opentelemetry, "
        "triton,file=PATH, triton,log-frequency=N, opentelemetry,url=HOST:PORT/v1/traces, "
        "opentelemetry,resource=KEY=VALUE, opentelemetry,bsp_max_queue_size=N, "
        "opentelemetry,bsp_schedule_delay=MS, opentelemetry,bsp_max_export_batch_size=N "
        "(repeatable; Triton's flag)", default=[], repeatable=True, metavar="[MODE,]KEY=VALUE", triton=True)
    # Triton's deprecated spellings: folded into --trace-config as they are parsed (options.fold_deprecated_trace).
    trace_file: str | None = setting(("--trace-file",), "deprecated: --trace-config triton,file=PATH", triton=True)
    trace_level: list[str] = setting(
        ("--trace-level",), "deprecated: --trace-config level=LEVEL", default=[], repeatable=True, triton=True)
    trace_rate: int | None = setting(("--trace-rate",), "deprecated: --trace-config rate=N", kind=int, triton=True)
    trace_count: int | None = setting(("--trace-count",), "deprecated: --trace-config count=N", kind=int, triton=True)
    trace_log_frequency: int | None = setting(
        ("--trace-log-frequency",), "deprecated: --trace-config triton,log-frequency=N", kind=int, triton=True)


class Metrics(Settings):
    """Metrics: the router keeps them, the metrics ingress serves them."""

    ACTORS = frozenset({ROUTER, INGRESS})
    # Every ingress process is handed them (it parses them as the metrics one does); only the
    # metrics process (--protocol metrics) reads them.
    allow_cpu_metrics: bool = setting(
        ("--allow-cpu-metrics",), "report CPU utilization and memory in /metrics", kind=triton_bool,
        default=True, metavar="BOOL", triton=True)
    allow_gpu_metrics: bool = setting(
        ("--allow-gpu-metrics",), "report GPU utilization, memory and power in /metrics", kind=triton_bool,
        default=True, metavar="BOOL", triton=True)
    metrics_interval_ms: int = setting(
        ("--metrics-interval-ms",), "how often CPU and GPU metrics are sampled", kind=int, default=2000,
        metavar="MS", triton=True)
    metrics_config: list[str] = setting(
        ("--metrics-config",), "summary_latencies=<bool>, summary_quantiles=<q:err,...>, "
        "counter_latencies=<bool>, histogram_latencies=<bool> (repeatable; Triton's flag)",
        default=[], repeatable=True, metavar="KEY=VALUE", triton=True)
