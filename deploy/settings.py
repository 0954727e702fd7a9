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
    checked,
    dispatch_cpu_text,
    port_range,
    triton_bool,
    triton_int_bool,
)
from conveyor.deploy.ingress_settings import (
    CLOUD_SECTION,
    OPENAI_SECTION,
    Answers,
    CloudDefaults,
    GrpcAccess,
    GrpcServer,
    HttpAccess,
    HttpEdge,
    OpenAiAccess,
    OpenAiDefaults,
    OpenAiKeys,
    RequestLimits,
)
from conveyor.deploy.instances import INGRESS_PROTOCOLS
from conveyor.deploy.router_settings import (
    ClientSharedMemory,
    Metrics,
    ModelControl,
    Repository,
    Scheduling,
    Tracing,
)
from conveyor.deploy.runtime.log_settings import FORMATS
from conveyor.deploy.setting_types import (
    CHILDREN,
    INGRESS,
    ROUTER,
    SERVE,
    SUPERVISOR,
    WORKER,
    Setting,
    Settings,
    setting,
)


def _cmds(*names: str) -> frozenset[str]:
    return frozenset(names)


# Who uses the settings a class declares (Settings.ACTORS).
_EVERY = _cmds(SUPERVISOR, *CHILDREN)
_SUPERVISOR = _cmds(SUPERVISOR)
_SUPERVISOR_INGRESS = _cmds(SUPERVISOR, INGRESS)
_ARENA = _cmds(SUPERVISOR, INGRESS, WORKER)


def _vertex_mode() -> bool:
    return os.environ.get("AIP_MODE", "") == "PREDICTION"


def _off_in_vertex_mode() -> bool:
    # AIP_MODE=PREDICTION: Vertex AI's endpoint serves, HTTP and gRPC are off unless asked for.
    return not _vertex_mode()


_UNUSED = "Triton flags accepted but not used (logged once at start, with the reason)"


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
        ("--log-format",), "the log line's layout: default or ISO8601 (Triton's lines, each message a JSON string "
        "unless $TRITON_SERVER_ESCAPE_LOG_MESSAGES=0), or conveyor (Conveyor's: time, role[pid], level, logger)",
        default="conveyor", triton_default="default", choices=FORMATS, triton=True)
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
        section=CLOUD_SECTION)
    vertex_ai_port: int = setting(
        ("--vertex-ai-port",), "the Vertex AI endpoint's port (default AIP_HTTP_PORT, else 8080)",
        kind=int, default=8080, env="AIP_HTTP_PORT",
        triton=True, section=CLOUD_SECTION)
    # --default-max-tokens are the flags of Triton's OpenAI frontend (python/openai/openai_frontend/main.py).
    openai_port: int = setting(
        ("--openai-port",), "serve /v1/models, /v1/completions and /v1/chat/completions on this port "
        "(default: off)", kind=int, default=0,
        section=OPENAI_SECTION)
    openai_address: str = setting(
        ("--openai-address",), "the OpenAI endpoint's address (default: --http-address)", default="",
        section=OPENAI_SECTION)


class Arena(Settings):
    """Each process that writes tensors has a shared-memory arena of this size."""

    ACTORS = _ARENA
    arena_size: int = setting(
        ("--arena-size",), "bytes of each process's shared-memory arena (tmpfs: only touched pages count)",
        kind=int, default=256 << 20)


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
        default=1, section=OPENAI_SECTION, also=_cmds(INGRESS))
    allow_sagemaker: bool = setting(
        ("--allow-sagemaker",), "serve SageMaker's /ping, /invocations and /models on --sagemaker-port "
        "(default false)", kind=triton_bool, default=False, metavar="BOOL", triton=True,
        section=CLOUD_SECTION, also=_cmds(INGRESS))
    sagemaker_safe_port_range: tuple | None = setting(
        ("--sagemaker-safe-port-range",), "the ports the other endpoints must use when SageMaker is on",
        kind=port_range, metavar="<integer>-<integer>", triton=True, section=CLOUD_SECTION, also=_cmds(INGRESS))
    allow_vertex_ai: bool = setting(
        ("--allow-vertex-ai",), "serve Vertex AI's AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE on --vertex-ai-port "
        "(default true when AIP_MODE=PREDICTION, which also turns HTTP and gRPC off by default)",
        kind=triton_bool, default=False, default_from=_vertex_mode, metavar="BOOL", triton=True,
        section=CLOUD_SECTION, also=_cmds(INGRESS))


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
    # gRPC frontend flags Triton added in 2025, after 2.51: an existing command line must not exit.
    unused_grpc_infer_thread_count: int | None = _unused(
        "--grpc-infer-thread-count", int,
        "each gRPC ingress process serves its calls on one event loop: scale with --grpc-ingress")
    unused_grpc_max_response_pool_size: int | None = _unused(
        "--grpc-max-response-pool-size", int,
        "responses are not pooled objects: each is encoded as it is sent, and what one process holds is "
        "bounded by --max-inflight-requests")
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


class HttpIngressSettings(EveryProcess, Draining, Listening, Arena, RequestLimits, HttpEdge, HttpAccess, OpenAiAccess,
                          Answers, IngressProcess):
    """``conveyor ingress --protocol http``: KServe v2 over HTTP."""


class GrpcIngressSettings(EveryProcess, Draining, Listening, Arena, RequestLimits, GrpcServer, GrpcAccess, Answers,
                          IngressProcess):
    """``conveyor ingress --protocol grpc``: KServe v2 over gRPC."""


class OpenAiIngressSettings(EveryProcess, Draining, Listening, Arena, RequestLimits, HttpEdge, HttpAccess, OpenAiAccess,
                            OpenAiKeys, Answers, OpenAiDefaults, IngressProcess):
    """``conveyor ingress --protocol openai``: the OpenAI-compatible endpoint."""


class CloudIngressSettings(EveryProcess, Draining, Listening, Arena, RequestLimits, HttpEdge, HttpAccess, OpenAiAccess,
                           Answers, CloudDefaults, IngressProcess):
    """``conveyor ingress --protocol sagemaker|vertex``: the cloud endpoints."""


class MetricsIngressSettings(EveryProcess, Draining, Listening, HttpEdge, OpenAiAccess, Answers, Metrics,
                             IngressProcess):
    """``conveyor ingress --protocol metrics``: /metrics."""


class IngressSettings(HttpIngressSettings, GrpcIngressSettings, OpenAiIngressSettings, CloudIngressSettings,
                      MetricsIngressSettings):
    """``conveyor ingress``: every ingress kind's settings (one command and one systemd unit for all, so each
    ingress process is handed them all; each kind reads its own class)."""


class ServeSettings(EveryProcess, Draining, Listening, Arena, RequestLimits, HttpEdge, GrpcServer, HttpAccess,
                    OpenAiAccess, OpenAiKeys, GrpcAccess, Answers, CloudDefaults, OpenAiDefaults, Repository,
                    Scheduling, ModelControl, ClientSharedMemory, Tracing, Metrics, GroupShape, TritonUnused):
    """``conveyor serve`` and ``tritonserver``: what the supervisor reads and what it hands its children."""


# Every declaring class, in --help's order.
DECLARED: tuple[type[Settings], ...] = (
    EveryProcess, Draining, Listening, Arena, RequestLimits, HttpEdge, GrpcServer, HttpAccess, OpenAiAccess, OpenAiKeys,
    GrpcAccess, Answers, CloudDefaults, OpenAiDefaults, Repository, Scheduling, ModelControl, ClientSharedMemory,
    Tracing, Metrics, GroupShape, TritonUnused, RouterProcess, IngressProcess, WorkerProcess)
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


def handoff_environment(a: Settings | argparse.Namespace, actor: str) -> dict[str, str]:
    """The secrets a child of ``actor`` gets in its environment (``Setting.secret_env``), not on its command line."""
    out: dict[str, str] = {}
    for s in SETTINGS:
        if s.secret_env and actor in s.actors and SERVE in s.commands:
            out.update(s.environment(getattr(a, s.name)))
    return out


def unused() -> tuple[Setting, ...]:
    """Triton's flags accepted and not used."""
    return tuple(s for s in SETTINGS if s.unused)


def grpc_keepalive() -> tuple[Setting, ...]:
    """Triton's gRPC keepalive flags, each setting one grpc core channel argument."""
    return tuple(s for s in SETTINGS if s.grpc_option)

