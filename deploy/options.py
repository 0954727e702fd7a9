"""What the parsed settings mean together: where a group's sockets live, Triton's deprecated
flags folded into the ones they stand for, the checks across flags, and the values several
settings make (log settings, HTTP edge limits, gRPC server options). The flags themselves are
declared once in ``deploy/settings.py``."""

from __future__ import annotations

import argparse
import os
from typing import Protocol

from conveyor.deploy.flag_types import RestrictedGroup, triton_bool, triton_int_bool
from conveyor.deploy.runtime.group_paths import RUN_DIR_ENV, run_dir
from conveyor.deploy.runtime.log_settings import LogSettings
from conveyor.deploy.settings import (
    ROUTER,
    EveryProcess,
    GrpcIngressSettings,
    GrpcServer,
    HttpEdge,
    IngressSettings,
    Metrics,
    OpenAiAccess,
    ServeSettings,
    grpc_keepalive,
    handoff,
)
from conveyor.ingress.http.edge import EdgeLimits
from conveyor.ingress.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_BYTES
from conveyor.ingress.restricted import (
    CATEGORIES,
    Restriction,
    openai_restrictions,
    port_rules,
    restrictions,
)

# Their homes are flag_types.py and runtime/group_paths.py; imported from here before them.
__all__ = ["RUN_DIR_ENV", "run_dir", "triton_bool", "triton_int_bool"]


def default_endpoints(group: str) -> tuple[str, str]:
    """The router's ingress-facing and worker-facing ZeroMQ endpoints (IPC on this host)."""
    d = run_dir(group)
    return f"ipc://{d}/router-ingress.sock", f"ipc://{d}/router-workers.sock"


def grpc_keepalive_options(a: GrpcServer) -> list[tuple[str, int]]:
    """The grpc server options the keepalive flags stand for (those left unset are left out)."""
    return [(s.grpc_option, int(getattr(a, s.name))) for s in grpc_keepalive() if getattr(a, s.name) is not None]


def fold_response_cache_size(a: argparse.Namespace) -> str:
    """--response-cache-byte-size as the --cache-config it stands for; a problem, or ''."""
    if a.response_cache_byte_size is None:
        return ""
    if a.cache_config:
        return ("Error: Incompatible flags --response-cache-byte-size and --cache-config both provided. "
                "Please provide one or the other.")
    a.cache_config = [f"local,size={a.response_cache_byte_size}"]
    a.response_cache_byte_size = None
    return ""


def fold_http_max_input_size(a: argparse.Namespace) -> str:
    """--http-max-input-size as the limits it stands for; a problem, or ''. Triton's one bound on an HTTP
    request's input (src/http_server.cc ``max_input_size_``): its JSON, and what a compressed body inflates
    to. Conveyor's are --max-json-bytes and --http-max-body-bytes (the body, decompressed included): it sets
    each that is left at its default."""
    size = a.http_max_input_size
    if size is None:
        return ""
    if size <= 0:
        return "Error: --http-max-input-size must be greater than 0."  # Triton's words
    if a.max_json_bytes == DEFAULT_MAX_JSON_BYTES:
        a.max_json_bytes = size
    if a.http_max_body_bytes == DEFAULT_MAX_BODY_BYTES:
        a.http_max_body_bytes = size
    a.http_max_input_size = None
    return ""


def model_control_args(a: ServeSettings) -> list[str]:
    """The flags the router is started with, the model-control ones among them (``settings.handoff``)."""
    return handoff(a, ROUTER)


def http_edge(a: HttpEdge) -> EdgeLimits:
    """The HTTP edge limits the flags set."""
    return EdgeLimits(a.http_max_connections, a.http_header_timeout_secs, a.http_body_timeout_secs,
                      a.http_write_timeout_secs)


# What ``--grpc-server auto`` serves with when grpcio is not needed: the event loop's gRPC server on
# libnghttp2 (~30 µs of server CPU per unary call, h2's ~150; every limit and attack test passes on
# both). It falls back to h2, with an error logged, when its start-up self-test fails.
AUTO_GRPC_SERVER = "ngh2"


def grpc_server_choice(a: GrpcIngressSettings) -> str:
    """Which gRPC server serves: ngh2 (plaintext, TLS or mutual TLS, Triton's keepalive and connection-age
    flags included) for ``--grpc-server auto``; ``h2`` and ``ngh2`` are the event loop's server on either HTTP/2
    engine, and ``grpcio`` grpc.aio, taken as named."""
    if a.grpc_server != "auto":
        return str(a.grpc_server)
    return AUTO_GRPC_SERVER


def check_ingress_args(a: IngressSettings | ServeSettings) -> str:
    """Why these ingress flags cannot work together, or ''."""
    from conveyor.ingress.header_forward import check_pattern

    for flag, pattern in (("--http-header-forward-pattern", a.http_header_forward_pattern),
                          ("--grpc-header-forward-pattern", a.grpc_header_forward_pattern)):
        problem = check_pattern(flag, pattern)
        if problem:
            return problem

    for flag, groups in (("--http-restricted-api", a.http_restricted_api),
                         ("--grpc-restricted-protocol", a.grpc_restricted_protocol)):
        try:
            restrictions(groups)
        except ValueError as err:
            return f"{flag}: {err}"
    try:
        openai_restrictions(a.openai_restricted_api)
    except ValueError as err:
        return f"--openai-restricted-api: {err}"
    if a.grpc_use_ssl or a.grpc_use_ssl_mutual:
        if not a.grpc_server_cert or not a.grpc_server_key:
            return "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"
        if a.grpc_use_ssl_mutual and not a.grpc_root_cert:
            return "--grpc-use-ssl-mutual needs --grpc-root-cert"
    if bool(a.http_ssl_cert) != bool(a.http_ssl_key):
        return "--http-ssl-cert and --http-ssl-key go together"
    for path in (a.grpc_server_cert, a.grpc_server_key, a.grpc_root_cert, a.http_ssl_cert, a.http_ssl_key):
        if path and not os.path.isfile(path):
            return f"no such file: {path}"
    return ""


class _AccessFlags(Protocol):
    """The restricted-API flags of the HTTP-family ports (the settings classes that read both)."""

    http_restricted_api: list[RestrictedGroup]
    openai_restricted_api: list[RestrictedGroup]


def http_rules(a: _AccessFlags) -> dict[str, Restriction]:
    """What the KServe HTTP app enforces (HTTP, SageMaker, Vertex AI ports): --http-restricted-api, and
    --openai-restricted-api for the categories the first leaves open."""
    return port_rules(restrictions(a.http_restricted_api), openai_restrictions(a.openai_restricted_api))


def openai_rules(a: _AccessFlags) -> dict[str, Restriction]:
    """What the OpenAI port enforces: its own flag, and --http-restricted-api for the categories it leaves open."""
    return port_rules(openai_restrictions(a.openai_restricted_api), restrictions(a.http_restricted_api))


def metrics_rules(a: OpenAiAccess) -> dict[str, Restriction]:
    """What /metrics enforces (the metrics port, Vertex AI's redirect): the OpenAI flag's ``metrics``."""
    return {c: r for c, r in openai_restrictions(a.openai_restricted_api).items() if c == "metrics"}


def grpc_left_open(a: ServeSettings) -> list[str]:
    """Categories the HTTP-family flags restrict and gRPC serves with no restriction of its own (Triton
    restricts each protocol by its own flag; ``conveyor serve`` warns of these)."""
    http = {**restrictions(a.http_restricted_api), **openai_restrictions(a.openai_restricted_api)}
    grpc = restrictions(a.grpc_restricted_protocol)
    return [c for c in CATEGORIES if c in http and c not in grpc]


_METRICS_CONFIG_KEYS = ("summary_latencies", "summary_quantiles", "counter_latencies", "histogram_latencies")


def metrics_config(a: Metrics) -> dict[str, str]:
    """``--metrics-config`` as a dict; unknown keys are refused as Triton does."""
    out: dict[str, str] = {}
    for item in a.metrics_config:
        key, sep, value = item.partition("=")
        if not sep or key not in _METRICS_CONFIG_KEYS:
            raise ValueError(f"unknown --metrics-config '{item}' (keys: {', '.join(_METRICS_CONFIG_KEYS)})")
        out[key] = value
    return out


def log_settings(a: EveryProcess) -> LogSettings:
    return LogSettings(a.log_file, a.log_info, a.log_warning, a.log_error, a.log_verbose, a.log_format)


def fold_deprecated_trace(a: argparse.Namespace) -> None:
    """Triton's deprecated --trace-* flags become --trace-config items; an explicit --trace-config
    setting of the same key wins, as in Triton (PostProcessTraceArgs)."""
    given = {item.split(",", 1)[-1].split("=", 1)[0] for item in a.trace_config}
    extra: list[str] = []
    levels = [lv for lv in a.trace_level if lv]
    if levels and "level" not in given:
        extra += [f"level={lv}" for lv in levels]
    for key, value in (("rate", a.trace_rate), ("count", a.trace_count)):
        if value is not None and key not in given:
            extra.append(f"{key}={value}")
    if a.trace_file is not None and "file" not in given:
        extra.append(f"triton,file={a.trace_file}")
    if a.trace_log_frequency is not None and "log-frequency" not in given:
        extra.append(f"triton,log-frequency={a.trace_log_frequency}")
    a.trace_config = [*extra, *a.trace_config]
    a.trace_level, a.trace_rate, a.trace_count, a.trace_file, a.trace_log_frequency = [], None, None, None, None
