"""Every setting of the command line, declared once, as the typed settings each actor reads.

Each class below declares a few settings (``name: type = setting(flag, help, ...)``) and says who uses them
(``ACTORS``); ``RouterSettings``, ``WorkerSettings``, ``ServeSettings`` and one class per ingress kind
(``HttpIngressSettings``, ...) combine them into what one actor reads, typed
(``RouterSettings.of(namespace)``). From the same declarations come the argument parsers of ``conveyor
serve|router|ingress|worker`` and of ``tritonserver`` (``build_options``), the command lines ``conveyor
serve`` starts its children with (``handoff``: a child gets exactly the settings its actor uses, as the flags
of its own parser, so ``conveyor router ...`` typed by hand reads the same), the Triton flags accepted but not
used (``unused``, ``deploy/triton_flags.py``) and docs/CLI.md (``deploy/cli_doc.py``). Adding a flag is adding
one line to the class of those who use it and reading it in the actor; ``tests/deploy/test_settings.py`` fails
when a setting a child uses does not reach it, or when an actor's class and the declarations disagree.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from conveyor.deploy.flag_types import (
    RestrictedGroup,
    backend_setting,
    cache_config,
    checked,
    dispatch_cpu_text,
    load_threads,
    port_range,
    resource_limit,
    restricted_group,
    restricted_text,
    triton_bool,
    triton_bool_int,
    triton_int_bool,
)
from conveyor.deploy.instances import INGRESS_PROTOCOLS
from conveyor.deploy.setting import (
    CHILDREN,
    INGRESS,
    ROUTER,
    SERVE,
    SUPERVISOR,
    WORKER,
    Setting,
    Settings,
    path_text,
    setting,
)
from conveyor.ingress.http.body import DEFAULT_MAX_BODY_BYTES
from conveyor.ingress.http.edge import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, MAX_CONNECTIONS, WRITE_TIMEOUT_S
from conveyor.ingress.limits import (
    DEFAULT_GRPC_BUFFER_BYTES,
    DEFAULT_GRPC_CONNECTION_BUFFER_BYTES,
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_INPUT_ELEMENTS,
    DEFAULT_MAX_JSON_BYTES,
)
from conveyor.router.scheduling.queue_policy import DEFAULT_QUEUE_CAP
from conveyor.router.shared_memory.client_regions import DEFAULT_MAX_REGIONS


def _cmds(*names: str) -> frozenset[str]:
    return frozenset(names)


# Who uses the settings a class declares (Settings.ACTORS).
_EVERY = _cmds(SUPERVISOR, *CHILDREN)
_SUPERVISOR = _cmds(SUPERVISOR)
_SUPERVISOR_INGRESS = _cmds(SUPERVISOR, INGRESS)
_ARENA = _cmds(SUPERVISOR, INGRESS, WORKER)
_INGRESS = _cmds(INGRESS)
_ROUTER = _cmds(ROUTER)
_SUPERVISOR_ROUTER = _cmds(SUPERVISOR, ROUTER)
_ROUTER_INGRESS = _cmds(ROUTER, INGRESS)


def _vertex_mode() -> bool:
    return os.environ.get("AIP_MODE", "") == "PREDICTION"


def _off_in_vertex_mode() -> bool:
    # AIP_MODE=PREDICTION: Vertex AI's endpoint serves, HTTP and gRPC are off unless asked for.
    return not _vertex_mode()


_CLOUD = "SageMaker and Vertex AI endpoints"
_OPENAI = "OpenAI-compatible endpoint"
_UNUSED = "Triton flags accepted but not used (logged once at start, with the reason)"


def _grpc_keepalive(flag: str, option: str, default: int | None) -> Any:
    boolean = flag.endswith("without-calls")
    return setting((flag,), f"Triton's flag: sets the gRPC server's {option}",
                   kind=triton_bool_int if boolean else int, default=default, metavar="BOOL" if boolean else "MS",
                   triton=True, grpc_option=option)


def _unused(flag: str, kind: Callable[[str], Any], reason: str, repeatable: bool = False) -> Any:
    # Declared as unused_<flag>: what the group reads is only whether it was given (triton_flags.py).
    return setting((flag,), f"not used: {reason}", kind=kind, metavar="VALUE", repeatable=repeatable,
                   triton=True, section=_UNUSED, unused=reason)


_THREADS = "each ingress process is one event loop; scale them with --http-ingress / --grpc-ingress instead"
_GPU_POOL = ("each backend allocates GPU memory through its own framework (ONNX Runtime, PyTorch, TensorRT) "
             "and tensors cross processes in shared memory: the server keeps no pool of its own")



class EveryProcess(Settings):
    """What every process of the group reads: its group, logging, CPU and stop settings."""

    ACTORS = _EVERY
    group: str | None = setting(
        ("--group",), "name of this process group: shared-memory names and IPC paths carry it (default: "
        "'default'; 'conveyor serve' takes 'default-2', ... when that one is running)")
    log_verbose: int = setting(
        ("--log-verbose",), "verbose logging level (Triton's flag)", kind=triton_int_bool, default=0, triton=True)
    log_info: bool = setting(
        ("--log-info",), "log informational messages", kind=triton_bool, default=True, metavar="BOOL", triton=True)
    log_warning: bool = setting(
        ("--log-warning",), "log warnings", kind=triton_bool, default=True, metavar="BOOL", triton=True)
    log_error: bool = setting(
        ("--log-error",), "log errors", kind=triton_bool, default=True, metavar="BOOL", triton=True)
    log_file: str = setting(
        ("--log-file",), "append the log here instead of stderr (every process of the group)", default="", triton=True)
    log_format: str = setting(
        ("--log-format",), "the log line's layout: default (Triton's glog-like lines) or ISO8601 timestamps",
        default="default", choices=("default", "ISO8601"), triton=True)
    spin_us: str | None = setting(
        ("--spin-us",), "router and workers spin this long on their sockets before sleeping (0 = never); "
        "default auto: 50 on hosts with 8 or more cores, else 0 (deploy/runtime/polling.py)",
        metavar="US|auto")
    # $CONVEYOR_IO_SCHED and $CONVEYOR_DISPATCH_CPU are read by the actor when the flag is not given.
    io_sched: str | None = setting(
        ("--io-sched",), "scheduling policy of each process's ZeroMQ I/O thread; default batch (SCHED_BATCH: it "
        "does not preempt the actor that woke it; deploy/runtime/io_threads.py), or $CONVEYOR_IO_SCHED",
        choices=("batch", "normal"))
    dispatch_cpu: str | None = setting(
        ("--dispatch-cpu",), "the core the router and each worker's main thread share; default auto: the last "
        "CPU on hosts with 2 CPUs, none on larger ones (deploy/runtime/dispatch_cpu.py), or $CONVEYOR_DISPATCH_CPU",
        kind=checked(dispatch_cpu_text), metavar="auto|off|CPU")
    exit_timeout_secs: float = setting(
        ("--exit-timeout-secs",), "how long shutdown waits for in-flight requests", kind=float, default=30.0,
        triton=True)


class Draining(Settings):
    """How a stopping group lets load balancers turn away first."""

    ACTORS = _cmds(SUPERVISOR, INGRESS, ROUTER)
    # The router is handed 0 (Supervisor._router_child): it stops after the ingress, which carry the grace.
    drain_grace_secs: float = setting(
        ("--drain-grace-secs",), "on SIGTERM, how long readiness reads false while requests are still served, "
        "so load balancers stop sending first; then new requests get UNAVAILABLE and in-flight ones get "
        "--exit-timeout-secs to finish", kind=float, default=5.0, triton_default=0.0)


class Listening(Settings):
    """Where the group listens: the supervisor checks the ports before it starts, each ingress binds its own."""

    ACTORS = _SUPERVISOR_INGRESS
    http_port: int = setting(("--http-port",), "the HTTP/REST port (KServe v2)", kind=int, default=8000, triton=True)
    grpc_port: int = setting(("--grpc-port",), "the gRPC port (KServe v2)", kind=int, default=8001, triton=True)
    metrics_port: int = setting(
        ("--metrics-port",), "the Prometheus /metrics port", kind=int, default=8002, triton=True)
    http_address: str = setting(
        ("--http-address",), "the address the HTTP port listens on", default="0.0.0.0", triton=True)
    grpc_address: str = setting(
        ("--grpc-address",), "the address the gRPC port listens on", default="0.0.0.0", triton=True)
    metrics_address: str = setting(
        ("--metrics-address",), "where /metrics listens (default: --http-address)", default="", triton=True)
    sagemaker_port: int = setting(
        ("--sagemaker-port",), "the SageMaker endpoint's port (default 8080)", kind=int, default=8080, triton=True,
        section=_CLOUD)
    vertex_ai_port: int = setting(
        ("--vertex-ai-port",), "the Vertex AI endpoint's port (default AIP_HTTP_PORT, else 8080)",
        kind=int, default=8080, env="AIP_HTTP_PORT",
        triton=True, section=_CLOUD)
    # --default-max-tokens are the flags of Triton's OpenAI frontend (python/openai/openai_frontend/main.py).
    openai_port: int = setting(
        ("--openai-port",), "serve /v1/models, /v1/completions and /v1/chat/completions on this port "
        "(default: off)", kind=int, default=0,
        section=_OPENAI)
    openai_address: str = setting(
        ("--openai-address",), "the OpenAI endpoint's address (default: --http-address)", default="", section=_OPENAI)


class Arena(Settings):
    """Each process that writes tensors has a shared-memory arena of this size."""

    ACTORS = _ARENA
    arena_size: int = setting(
        ("--arena-size",), "bytes of each process's shared-memory arena (tmpfs: only touched pages count)",
        kind=int, default=256 << 20)


class RequestLimits(Settings):
    """What one ingress process takes of a client's requests, whatever its protocol (ingress/limits.py)."""

    ACTORS = _INGRESS
    max_input_elements: int = setting(
        ("--max-input-elements",), "elements one input tensor may hold; more is refused with 400 / "
        f"INVALID_ARGUMENT; 0: no limit (default {DEFAULT_MAX_INPUT_ELEMENTS})",
        kind=int, default=DEFAULT_MAX_INPUT_ELEMENTS, metavar="N")
    max_json_bytes: int = setting(
        ("--max-json-bytes",), "largest JSON part of an HTTP request (JSON tensors take ~8x their text in "
        f"memory); more is refused with 400; 0: no limit (default {DEFAULT_MAX_JSON_BYTES})",
        kind=int, default=DEFAULT_MAX_JSON_BYTES, metavar="BYTES")
    max_inflight_requests: int = setting(
        ("--max-inflight-requests",), "requests one ingress process holds at once; more are refused with 503 / "
        f"UNAVAILABLE 'too many requests in flight'; 0: no limit (default {DEFAULT_MAX_INFLIGHT})",
        kind=int, default=DEFAULT_MAX_INFLIGHT, metavar="N")


class HttpEdge(Settings):
    """What one HTTP client may hold of an ingress process (ingress/http/edge.py says why each)."""

    ACTORS = _INGRESS
    http_max_body_bytes: int = setting(
        ("--http-max-body-bytes",), f"largest HTTP request body, after decompression "
        f"(default {DEFAULT_MAX_BODY_BYTES})",
        kind=int, default=DEFAULT_MAX_BODY_BYTES, metavar="BYTES")
    # What one HTTP client may hold of an ingress process (ingress/http/edge.py says why each).
    http_max_connections: int = setting(
        ("--http-max-connections",), "client connections one HTTP ingress process holds; past it the one "
        "waiting longest for a request is closed, or with none waiting the new one gets 503; 0: no limit "
        f"(default {MAX_CONNECTIONS})",
        kind=int, default=MAX_CONNECTIONS, metavar="N")
    http_header_timeout_secs: float = setting(
        ("--http-header-timeout-secs",), "a request head must arrive within this, from the connection or from "
        f"its first byte; else 408 and the connection closes; 0: no limit (default {HEADER_TIMEOUT_S:g})",
        kind=float, default=HEADER_TIMEOUT_S, metavar="S")
    http_body_timeout_secs: float = setting(
        ("--http-body-timeout-secs",), "the longest silence while a request body is still due; then 408 and "
        f"the connection closes; 0: no limit (default {BODY_TIMEOUT_S:g})",
        kind=float, default=BODY_TIMEOUT_S, metavar="S")
    http_write_timeout_secs: float = setting(
        ("--http-write-timeout-secs",), "how long a client may leave its answer unread once its send buffer is "
        "full (its connection is not read meanwhile); then it is dropped; 0: no limit "
        f"(default {WRITE_TIMEOUT_S:g})",
        kind=float, default=WRITE_TIMEOUT_S, metavar="S")


class GrpcServer(Settings):
    """The gRPC server: which one, the request bytes it holds, Triton's keepalive flags (grpc channel arguments)."""

    ACTORS = _INGRESS
    grpc_server: str = setting(
        ("--grpc-server",), "the gRPC server: h2 (on the event loop, over python-hyper's h2, with the HTTP/2 "
        "limits of docs/SECURITY.md) or grpcio (grpc.aio); auto: h2 unless TLS or a --grpc-keepalive/http2 "
        "flag asks for what only grpcio does. Default: $CONVEYOR_GRPC_SERVER, else auto",
        default="auto", env="CONVEYOR_GRPC_SERVER", choices=("auto", "grpcio", "h2"))
    # The gRPC server on h2 (--grpc-server h2, the default): request bytes held before calls take them.
    grpc_max_buffer_bytes: int = setting(
        ("--grpc-max-buffer-bytes",), "request message bytes one gRPC ingress process holds before their calls "
        "take them; the stream past it ends with RESOURCE_EXHAUSTED; 0: no limit "
        f"(default {DEFAULT_GRPC_BUFFER_BYTES}; --grpc-server h2)",
        kind=int, default=DEFAULT_GRPC_BUFFER_BYTES, metavar="BYTES")
    grpc_max_connection_buffer_bytes: int = setting(
        ("--grpc-max-connection-buffer-bytes",), "the same per gRPC connection; a larger message is refused at "
        f"its length prefix; 0: no limit but gRPC's 2 GiB (default {DEFAULT_GRPC_CONNECTION_BUFFER_BYTES}; "
        "--grpc-server h2)", kind=int, default=DEFAULT_GRPC_CONNECTION_BUFFER_BYTES, metavar="BYTES")
    grpc_keepalive_time: int = _grpc_keepalive("--grpc-keepalive-time", "grpc.keepalive_time_ms", 7200000)
    grpc_keepalive_timeout: int = _grpc_keepalive("--grpc-keepalive-timeout", "grpc.keepalive_timeout_ms", 20000)
    grpc_keepalive_permit_without_calls: int = _grpc_keepalive(
        "--grpc-keepalive-permit-without-calls", "grpc.keepalive_permit_without_calls", 0)
    grpc_http2_max_pings_without_data: int = _grpc_keepalive(
        "--grpc-http2-max-pings-without-data", "grpc.http2.max_pings_without_data", 2)
    grpc_http2_min_recv_ping_interval_without_data: int = _grpc_keepalive(
        "--grpc-http2-min-recv-ping-interval-without-data",
        "grpc.http2.min_ping_interval_without_data_ms", 300000)
    grpc_http2_max_ping_strikes: int = _grpc_keepalive(
        "--grpc-http2-max-ping-strikes", "grpc.http2.max_ping_strikes", 2)
    grpc_max_connection_age: int | None = _grpc_keepalive(
        "--grpc-max-connection-age", "grpc.max_connection_age_ms", None)
    # None: unset, as Triton
    grpc_max_connection_age_grace: int | None = _grpc_keepalive(
        "--grpc-max-connection-age-grace", "grpc.max_connection_age_grace_ms", None)


class HttpAccess(Settings):
    """Access control on HTTP (Triton's), HTTPS (a Conveyor extension), headers forwarded as parameters."""

    ACTORS = _INGRESS
    http_restricted_api: list[RestrictedGroup] = setting(
        ("--http-restricted-api",), "HTTP requests to these APIs need header <key>: <value> (repeatable; APIs: "
        "health, metadata, inference, shared-memory, model-config, model-repository, statistics, trace, logging)",
        kind=restricted_group, default=[], repeatable=True, metavar="<api>,...:<key>=<value>", triton=True,
        to_text=restricted_text)
    http_ssl_cert: str = setting(
        ("--http-ssl-cert",), "serve HTTPS with this certificate (a Conveyor extension: Triton serves plain "
        "HTTP)", default="", metavar="PEM", to_text=path_text)
    http_ssl_key: str = setting(
        ("--http-ssl-key",), "the HTTPS private key", default="", metavar="PEM", to_text=path_text)
    http_header_forward_pattern: str = setting(
        ("--http-header-forward-pattern",), "request headers whose name matches become string request "
        "parameters (case-insensitive unless the pattern starts with (?-i))", default="", metavar="REGEX", triton=True)


class GrpcAccess(Settings):
    """Access control and TLS on gRPC (Triton's), metadata forwarded as parameters."""

    ACTORS = _INGRESS
    grpc_restricted_protocol: list[RestrictedGroup] = setting(
        ("--grpc-restricted-protocol",), "gRPC calls to these protocols need metadata "
        "triton-grpc-protocol-<key>: <value> (repeatable)",
        kind=restricted_group, default=[], repeatable=True, metavar="<protocol>,...:<key>=<value>", triton=True,
        to_text=restricted_text)
    grpc_use_ssl: bool = setting(
        ("--grpc-use-ssl",), "serve gRPC over TLS", kind=triton_bool, default=False, metavar="BOOL", triton=True)
    grpc_use_ssl_mutual: bool = setting(
        ("--grpc-use-ssl-mutual",), "serve gRPC over mutual TLS: clients need a certificate signed by "
        "--grpc-root-cert", kind=triton_bool, default=False, metavar="BOOL", triton=True)
    grpc_server_cert: str = setting(
        ("--grpc-server-cert",), "the gRPC server's certificate (chain)", default="", metavar="PEM", triton=True,
        to_text=path_text)
    grpc_server_key: str = setting(
        ("--grpc-server-key",), "the gRPC server's private key", default="", metavar="PEM", triton=True,
        to_text=path_text)
    grpc_root_cert: str = setting(
        ("--grpc-root-cert",), "the CA certificate client certificates need", default="", metavar="PEM",
        triton=True, to_text=path_text)
    grpc_header_forward_pattern: str = setting(
        ("--grpc-header-forward-pattern",), "request metadata whose name matches become string request "
        "parameters", default="", metavar="REGEX", triton=True)


class Answers(Settings):
    """What every ingress answers with: the server's name, and the status of a client's mistakes."""

    ACTORS = _INGRESS
    server_id: str = setting(("--id",), "the server name server metadata reports", default="triton", triton=True)
    client_mistakes_as_400: bool = setting(
        ("--client-mistakes-as-400",), "answer the client mistakes Triton reports as 500 / INTERNAL (a model "
        "the repository does not hold, a malformed shape, an unopenable shared-memory key) with 400 / "
        "INVALID_ARGUMENT instead (default false: Triton's status, which its clients and QA assert)",
        kind=triton_bool, default=False, metavar="BOOL")


class CloudDefaults(Settings):
    """The cloud endpoints' defaults."""

    ACTORS = _INGRESS
    vertex_ai_default_model: str = setting(
        ("--vertex-ai-default-model",), "the model AIP_PREDICT_ROUTE infers (default: the repository's only "
        "model)", default="", metavar="NAME", triton=True, section=_CLOUD)


class OpenAiDefaults(Settings):
    """The OpenAI endpoint's defaults (Triton's OpenAI frontend flags)."""

    ACTORS = _INGRESS
    lora_separator: str = setting(
        ("--lora-separator",), "a model name '<model><separator><adapter>' picks one of the model's LoRA "
        "adapters (Triton's flag; default: off)", default="",
        section=_OPENAI)
    default_max_tokens: int = setting(
        ("--default-max-tokens",), "max_tokens of a request that sets none (default 16, as Triton's OpenAI "
        "frontend)", kind=int, default=16, section=_OPENAI)


class Repository(Settings):
    """The repositories and backend settings: the router loads from them, the supervisor builds the example one."""

    ACTORS = _SUPERVISOR_ROUTER
    # The router gets the repositories the supervisor serves (the example one when none is given).
    model_repository: list[str] = setting(
        ("--model-repository", "--model-store"), "a Triton model repository (repeatable)",
        default=[], repeatable=True, triton=True,
        required=_cmds(ROUTER))
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
    rate_limit: str = setting(
        ("--rate-limit",), "execution_count: an instance runs only when the resources its instance_group's "
        "rate_limiter lists are free (Triton's rate limiter); off: ignore rate_limiter",
        default="off", choices=("off", "execution_count"), triton=True)
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
        default="none", choices=("none", "poll", "explicit"), triton=True)
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

    ACTORS = _ROUTER_INGRESS
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


class GroupShape(Settings):
    """What 'conveyor serve' runs: which endpoints, and how many processes of each kind."""

    ACTORS = _SUPERVISOR
    allow_http: bool = setting(
        ("--allow-http",), "serve HTTP (default true; false when AIP_MODE=PREDICTION)", kind=triton_bool,
        default=True, default_from=_off_in_vertex_mode, metavar="BOOL", triton=True, also=_cmds(INGRESS))
    allow_grpc: bool = setting(
        ("--allow-grpc",), "serve gRPC (default true; false when AIP_MODE=PREDICTION)", kind=triton_bool,
        default=True, default_from=_off_in_vertex_mode, metavar="BOOL", triton=True, also=_cmds(INGRESS))
    allow_metrics: bool = setting(
        ("--allow-metrics",), "serve Prometheus metrics on --metrics-port", kind=triton_bool, default=True,
        metavar="BOOL", triton=True, also=_cmds(INGRESS))
    workers: int = setting(("--workers",), "worker processes", kind=int, default=2)
    http_ingress: int = setting(("--http-ingress",), "HTTP ingress processes", kind=int, default=1)
    grpc_ingress: int = setting(("--grpc-ingress",), "gRPC ingress processes", kind=int, default=1)
    openai_ingress: int = setting(
        ("--openai-ingress",), "OpenAI ingress processes (conveyor scale openai-ingress N)", kind=int,
        default=1, section=_OPENAI, also=_cmds(INGRESS))
    allow_sagemaker: bool = setting(
        ("--allow-sagemaker",), "serve SageMaker's /ping, /invocations and /models on --sagemaker-port "
        "(default false)", kind=triton_bool, default=False, metavar="BOOL", triton=True,
        section=_CLOUD, also=_cmds(INGRESS))
    sagemaker_safe_port_range: tuple | None = setting(
        ("--sagemaker-safe-port-range",), "the ports the other endpoints must use when SageMaker is on",
        kind=port_range, metavar="<integer>-<integer>", triton=True, section=_CLOUD, also=_cmds(INGRESS))
    allow_vertex_ai: bool = setting(
        ("--allow-vertex-ai",), "serve Vertex AI's AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE on --vertex-ai-port "
        "(default true when AIP_MODE=PREDICTION, which also turns HTTP and gRPC off by default)",
        kind=triton_bool, default=False, default_from=_vertex_mode, metavar="BOOL", triton=True,
        section=_CLOUD, also=_cmds(INGRESS))


class TritonUnused(Settings):
    """Triton's flags with no work to do in Conveyor's design."""

    ACTORS = _SUPERVISOR
    # tritonserver command line runs as it is, and logged once at start with the reason.
    unused_enable_peer_access: bool | None = _unused(
        "--enable-peer-access", triton_bool,
        "tensors travel between processes through shared memory and CUDA IPC, never GPU peer copies")
    unused_reuse_http_port: bool | None = _unused(
        "--reuse-http-port", triton_bool,
        "every HTTP ingress process already binds with SO_REUSEPORT: that is how several share a port")
    unused_reuse_grpc_port: bool | None = _unused(
        "--reuse-grpc-port", triton_bool,
        "every gRPC ingress process already binds with SO_REUSEPORT: that is how several share a port")
    unused_http_thread_count: int | None = _unused("--http-thread-count", int, _THREADS)
    unused_grpc_infer_allocation_pool_size: int | None = _unused(
        "--grpc-infer-allocation-pool-size", int,
        "requests are not pooled objects: each is a descriptor decoded from the wire, its tensors in the "
        "ingress's shared-memory arena")
    unused_grpc_infer_response_compression_level: str | None = _unused(
        "--grpc-infer-response-compression-level", str,
        "responses are sent uncompressed unless the client asks for a compression algorithm on its call")
    unused_backend_directory: str | None = _unused(
        "--backend-directory", str,
        "backends are Python modules inside Conveyor (onnxruntime, python, pytorch, tensorrt): "
        "no shared libraries are searched")
    unused_repoagent_directory: str | None = _unused(
        "--repoagent-directory", str,
        "repository agents (model_repository_agents) are not run: no agent libraries are loaded")
    unused_cache_directory: str | None = _unused(
        "--cache-directory", str, "the response cache is built into the router: no cache library is loaded")
    unused_pinned_memory_pool_byte_size: int | None = _unused(
        "--pinned-memory-pool-byte-size", int,
        "tensors live in POSIX shared-memory arenas (--arena-size); no pinned staging pool sits between "
        "them and the GPU")
    unused_cuda_memory_pool_byte_size: list[str] | None = _unused(
        "--cuda-memory-pool-byte-size", str, _GPU_POOL, repeatable=True)
    unused_cuda_virtual_address_size: list[str] | None = _unused(
        "--cuda-virtual-address-size", str,
        "implicit sequence state lives in each worker's memory, not in growable CUDA virtual memory",
        repeatable=True)
    unused_min_supported_compute_capability: float | None = _unused(
        "--min-supported-compute-capability", float,
        "GPUs are chosen by CUDA_VISIBLE_DEVICES and the instance groups; workers do not filter devices by "
        "compute capability")
    unused_buffer_manager_thread_count: int | None = _unused(
        "--buffer-manager-thread-count", int,
        "inputs and outputs are copied by the process that holds them, on its own thread: "
        "there is no buffer manager")
    unused_host_policy: list[str] | None = _unused(
        "--host-policy", str,
        "the server pins no process to NUMA nodes or cores: pin workers with numactl/taskset or systemd's "
        "CPUAffinity=/NUMAPolicy=", repeatable=True)
    unused_model_load_gpu_limit: list[str] | None = _unused(
        "--model-load-gpu-limit", str,
        "loads are not refused on GPU memory use: each worker's framework reports out-of-memory as a "
        "failed load", repeatable=True)
    # The cloud endpoints run as one event loop each.
    unused_sagemaker_thread_count: int | None = _unused("--sagemaker-thread-count", int, _THREADS)
    unused_vertex_ai_thread_count: int | None = _unused("--vertex-ai-thread-count", int, _THREADS)


class RouterProcess(Settings):
    """The router process's own (a child of conveyor serve finds them from --group)."""

    ONLY = _cmds(ROUTER)
    ingress_endpoint: str = setting(("--ingress-endpoint",), "ZeroMQ endpoint ingress processes connect to", default="")
    worker_endpoint: str = setting(("--worker-endpoint",), "ZeroMQ endpoint workers connect to", default="")


class IngressProcess(Settings):
    """One ingress process's own: what the supervisor sets per child, or a systemd unit per instance."""

    ONLY = _cmds(INGRESS)
    protocol: str = setting(
        ("--protocol",), "what this ingress process serves (the supervisor runs one process per protocol)",
        default="", choices=INGRESS_PROTOCOLS)
    instance: str = setting(
        ("--instance",), "a systemd instance name, <protocol>-<index> (http-0, grpc-1): sets --protocol",
        default="")
    router: str = setting(("--router",), "the router's ingress endpoint", default="")


class WorkerProcess(Settings):
    """One worker process's own: its router, and the systemd instance it runs as."""

    ONLY = _cmds(WORKER)
    router: str = setting(("--router",), "the router's worker endpoint", default="")
    ingress_endpoint: str = setting(
        ("--ingress-endpoint",), "the router's ingress endpoint, for BLS requests from models", default="")
    instance: str = setting(
        ("--instance",), "a systemd instance name: an index (0, 1, ...) or gpu<N> (sees only GPU N)",
        default="")


# --- what each actor reads ------------------------------------------------------------------------


class RouterSettings(EveryProcess, Draining, Repository, Scheduling, ModelControl, ClientSharedMemory, Tracing, Metrics,
                     RouterProcess):
    """``conveyor router``: the router's settings."""


class WorkerSettings(EveryProcess, Arena, WorkerProcess):
    """``conveyor worker``: a worker's settings."""


class HttpIngressSettings(EveryProcess, Draining, Listening, Arena, RequestLimits, HttpEdge, HttpAccess, Answers,
                          IngressProcess):
    """``conveyor ingress --protocol http``: KServe v2 over HTTP."""


class GrpcIngressSettings(EveryProcess, Draining, Listening, Arena, RequestLimits, GrpcServer, GrpcAccess, Answers,
                          IngressProcess):
    """``conveyor ingress --protocol grpc``: KServe v2 over gRPC."""


class OpenAiIngressSettings(EveryProcess, Draining, Listening, Arena, RequestLimits, HttpEdge, Answers, OpenAiDefaults,
                            IngressProcess):
    """``conveyor ingress --protocol openai``: the OpenAI-compatible endpoint."""


class CloudIngressSettings(EveryProcess, Draining, Listening, Arena, RequestLimits, HttpEdge, HttpAccess, Answers,
                           CloudDefaults, IngressProcess):
    """``conveyor ingress --protocol sagemaker|vertex``: the cloud endpoints."""


class MetricsIngressSettings(EveryProcess, Draining, Listening, HttpEdge, Answers, Metrics, IngressProcess):
    """``conveyor ingress --protocol metrics``: /metrics."""


class IngressSettings(HttpIngressSettings, GrpcIngressSettings, OpenAiIngressSettings, CloudIngressSettings,
                      MetricsIngressSettings):
    """``conveyor ingress``: every ingress kind's settings (one command and one systemd unit for all, so each
    ingress process is handed them all; each kind reads its own class)."""


class ServeSettings(EveryProcess, Draining, Listening, Arena, RequestLimits, HttpEdge, GrpcServer, HttpAccess,
                    GrpcAccess, Answers, CloudDefaults, OpenAiDefaults, Repository, Scheduling, ModelControl,
                    ClientSharedMemory, Tracing, Metrics, GroupShape, TritonUnused):
    """``conveyor serve`` and ``tritonserver``: what the supervisor reads and what it hands its children."""


# Every declaring class, in --help's order.
DECLARED: tuple[type[Settings], ...] = (
    EveryProcess, Draining, Listening, Arena, RequestLimits, HttpEdge, GrpcServer, HttpAccess, GrpcAccess, Answers,
    CloudDefaults, OpenAiDefaults, Repository, Scheduling, ModelControl, ClientSharedMemory, Tracing, Metrics,
    GroupShape, TritonUnused, RouterProcess, IngressProcess, WorkerProcess)
SETTINGS: tuple[Setting, ...] = tuple(s for cls in DECLARED for s in cls.declared())


def settings_of(command: str) -> Iterator[Setting]:
    """The settings ``command`` takes, in the table's order (its --help's order)."""
    return (s for s in SETTINGS if command in s.commands)


def build_options(p: argparse.ArgumentParser, command: str, triton: bool = False) -> None:
    """Add ``command``'s flags to ``p``; ``triton``: with tritonserver's defaults."""
    sections: dict[str, argparse._ArgumentGroup] = {}
    for s in settings_of(command):
        target: argparse.ArgumentParser | argparse._ArgumentGroup = p
        if s.section:
            if s.section not in sections:
                sections[s.section] = p.add_argument_group(s.section)
            target = sections[s.section]
        s.add_to(target, command, triton)


def handoff(a: Settings | argparse.Namespace, actor: str, overrides: Mapping[str, Any] | None = None) -> list[str]:
    """The flags a child of ``actor`` is started with: every setting it uses, as parsed (after
    Triton's aliases are folded), ``overrides`` (by dest) in place of the parsed values."""
    overrides = overrides or {}
    out: list[str] = []
    for s in SETTINGS:
        if actor in s.actors and SERVE in s.commands:
            out += s.argv(overrides[s.name] if s.name in overrides else getattr(a, s.name))
    return out


def unused() -> tuple[Setting, ...]:
    """Triton's flags accepted and not used."""
    return tuple(s for s in SETTINGS if s.unused)


def grpc_keepalive() -> tuple[Setting, ...]:
    """Triton's gRPC keepalive flags, each setting one grpc core channel argument."""
    return tuple(s for s in SETTINGS if s.grpc_option)

