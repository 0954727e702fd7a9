"""Command-line options, with the flag names and meanings a Triton user already types."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable

from conveyor.deploy.log_settings import LogSettings
from conveyor.ingress.http.body import DEFAULT_MAX_BODY_BYTES
from conveyor.ingress.http.edge import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, MAX_CONNECTIONS, WRITE_TIMEOUT_S, EdgeLimits
from conveyor.ingress.limits import (
    DEFAULT_GRPC_BUFFER_BYTES,
    DEFAULT_GRPC_CONNECTION_BUFFER_BYTES,
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_INPUT_ELEMENTS,
    DEFAULT_MAX_JSON_BYTES,
)
from conveyor.ingress.restricted import RestrictedGroup, parse_group
from conveyor.proto.dispatch_cpu import dispatch_cpu
from conveyor.proto.errors import ConveyorError
from conveyor.router.response_cache import parse_cache_config
from conveyor.router.scheduling.queue_policy import DEFAULT_QUEUE_CAP
from conveyor.router.shared_memory.client_regions import DEFAULT_MAX_REGIONS


def triton_bool(text: str) -> bool:
    """Triton's boolean flags take true/false (also 1/0, yes/no)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def triton_int_bool(text: str) -> int:
    """``--log-verbose``: an integer, or true/false as 1/0 (Triton's ParseIntBoolOption)."""
    value = text.strip().lower()
    if value in ("true", "false"):
        return int(value == "true")
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid option value: '{text}'") from None


# Where the IPC sockets live. systemd units set RuntimeDirectory=conveyor, which
# exports RUNTIME_DIRECTORY=/run/conveyor; CONVEYOR_RUN_DIR overrides both.
RUN_DIR_ENV = "CONVEYOR_RUN_DIR"


def run_dir(group: str) -> str:
    """The folder of this group's IPC sockets: ``<base>/<group>`` for a configured base,
    else ``$TMPDIR/conveyor-<group>``."""
    base = os.environ.get(RUN_DIR_ENV) or os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if base:
        return os.path.join(base, group)
    return os.path.join(tempfile.gettempdir(), f"conveyor-{group}")


def default_endpoints(group: str) -> tuple[str, str]:
    """The router's ingress-facing and worker-facing ZeroMQ endpoints (IPC on this host)."""
    d = run_dir(group)
    return f"ipc://{d}/router-ingress.sock", f"ipc://{d}/router-workers.sock"


def _checked(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse ``type``: the text as given once ``check`` accepts it; its ValueError becomes
    argparse's own error ("argument --flag: <message>")."""

    def parse(text: str) -> str:
        try:
            check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return parse


def _load_threads(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a number of threads, 1 or more: {text!r}")
    return n


def _backend_setting(text: str) -> object:
    from conveyor.router.repository.backend_config import parse_setting

    return parse_setting(text)


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group", default=None,
                   help="name of this process group: shared-memory names and IPC paths carry it (default: "
                        "'default'; 'conveyor serve' takes 'default-2', ... when that one is running)")
    p.add_argument("--log-verbose", type=triton_int_bool, default=0, help="verbose logging level (Triton's flag)")
    p.add_argument("--log-info", type=triton_bool, default=True, metavar="BOOL")
    p.add_argument("--log-warning", type=triton_bool, default=True, metavar="BOOL")
    p.add_argument("--log-error", type=triton_bool, default=True, metavar="BOOL")
    p.add_argument("--log-file", default="", help="append the log here instead of stderr (every process of the group)")
    p.add_argument("--log-format", choices=["default", "ISO8601"], default="default")
    p.add_argument("--spin-us", default=None, metavar="US|auto",
                   help="router and workers spin this long on their sockets before sleeping (0 = never); "
                        "default auto: 50 on hosts with 8 or more cores, else 0 (proto/polling.py)")
    p.add_argument("--io-sched", choices=["batch", "normal"], default=None,
                   help="scheduling policy of each process's ZeroMQ I/O thread; default batch (SCHED_BATCH: it "
                        "does not preempt the actor that woke it; proto/io_threads.py), or $CONVEYOR_IO_SCHED")
    p.add_argument("--dispatch-cpu", default=None, metavar="auto|off|CPU", type=_checked(dispatch_cpu),
                   help="the core the router and each worker's main thread share; default auto: the last CPU on "
                        "hosts with 2 CPUs, none on larger ones (proto/dispatch_cpu.py), or $CONVEYOR_DISPATCH_CPU")
    p.add_argument("--exit-timeout-secs", type=float, default=30.0,
                   help="how long shutdown waits for in-flight requests")


def add_drain(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drain-grace-secs", type=float, default=5.0,
                   help="on SIGTERM, how long readiness reads false while requests are still served, so load "
                        "balancers stop sending first; then new requests get UNAVAILABLE and in-flight ones get "
                        "--exit-timeout-secs to finish")


def add_network(p: argparse.ArgumentParser) -> None:
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--allow-http", type=triton_bool, default=True, metavar="BOOL")
    p.add_argument("--allow-grpc", type=triton_bool, default=True, metavar="BOOL")
    p.add_argument("--allow-metrics", type=triton_bool, default=True, metavar="BOOL")
    p.add_argument("--arena-size", type=int, default=256 << 20,
                   help="bytes of each process's shared-memory arena (tmpfs: only touched pages count)")
    p.add_argument("--metrics-address", default="", help="where /metrics listens (default: --http-address)")
    p.add_argument("--id", default="triton", dest="server_id", help="the server name server metadata reports")
    add_grpc_keepalive(p)


# Triton's gRPC keepalive flags and the grpc core channel arguments they set (its grpc/grpc_server.cc).
GRPC_KEEPALIVE = (
    ("--grpc-keepalive-time", "grpc.keepalive_time_ms", 7200000),
    ("--grpc-keepalive-timeout", "grpc.keepalive_timeout_ms", 20000),
    ("--grpc-keepalive-permit-without-calls", "grpc.keepalive_permit_without_calls", 0),
    ("--grpc-http2-max-pings-without-data", "grpc.http2.max_pings_without_data", 2),
    ("--grpc-http2-min-recv-ping-interval-without-data", "grpc.http2.min_ping_interval_without_data_ms", 300000),
    ("--grpc-http2-max-ping-strikes", "grpc.http2.max_ping_strikes", 2),
    ("--grpc-max-connection-age", "grpc.max_connection_age_ms", None),  # None: unset, as Triton
    ("--grpc-max-connection-age-grace", "grpc.max_connection_age_grace_ms", None),
)


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def add_grpc_keepalive(p: argparse.ArgumentParser) -> None:
    for flag, _arg, default in GRPC_KEEPALIVE:
        kind = (lambda t: int(triton_bool(t))) if flag.endswith("without-calls") else int
        p.add_argument(flag, type=kind, default=default, metavar="MS" if "calls" not in flag else "BOOL",
                       help=f"Triton's flag: sets the gRPC server's {_arg}")


def grpc_keepalive_options(a: argparse.Namespace) -> list[tuple[str, int]]:
    """The grpc server options the keepalive flags stand for (those left unset are left out)."""
    out = []
    for flag, arg, _default in GRPC_KEEPALIVE:
        value = getattr(a, _dest(flag))
        if value is not None:
            out.append((arg, int(value)))
    return out


def grpc_keepalive_args(a: argparse.Namespace) -> list[str]:
    return [x for flag, _arg, _d in GRPC_KEEPALIVE if getattr(a, _dest(flag)) is not None
            for x in (flag, str(getattr(a, _dest(flag))))]


def add_repository(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--model-repository", "--model-store", action="append", default=[], required=required,
                   dest="model_repository", help="a Triton model repository (repeatable)")


def add_client_shm(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-client-shm", type=triton_bool, default=False, metavar="BOOL",
                   help="let clients register system/CUDA shared-memory regions (off by default, as in Triton: "
                        "a client may name any segment the server's user can open)")
    p.add_argument("--max-client-shm-regions", type=int, default=DEFAULT_MAX_REGIONS, metavar="N",
                   help="shared-memory regions clients may hold registered at once; past it a registration is "
                        f"refused with 503 / UNAVAILABLE; 0: no limit (default {DEFAULT_MAX_REGIONS})")


def cache_config(text: str) -> str:
    try:
        parse_cache_config([text])
    except ConveyorError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def _resource_limit(text: str) -> str:
    from conveyor.router.scheduling.rate_limiter import ResourceLimit

    try:
        ResourceLimit.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_scheduling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-config", action="append", default=[], type=cache_config, metavar="local,size=BYTES",
                   help="Triton's response cache: models with response_cache { enable: true } are answered from "
                        "a cache of this many bytes of outputs (off by default)")
    p.add_argument("--response-cache-byte-size", type=int, default=None, metavar="BYTES",
                   help="deprecated (Triton's): --cache-config local,size=BYTES")
    p.add_argument("--max-queue-size", type=int, default=DEFAULT_QUEUE_CAP, metavar="N",
                   help="requests one model version may hold queued before new ones are refused with "
                        "'Exceeds maximum queue size' (503 / UNAVAILABLE), whatever its config says; 0: no cap "
                        f"(default {DEFAULT_QUEUE_CAP})")
    p.add_argument("--rate-limit", choices=["off", "execution_count"], default="off",
                   help="execution_count: an instance runs only when the resources its instance_group's "
                        "rate_limiter lists are free (Triton's rate limiter); off: ignore rate_limiter")
    p.add_argument("--rate-limit-resource", action="append", default=[], metavar="NAME:COUNT[:DEVICE]",
                   type=_resource_limit,
                   help="copies of a rate-limiter resource (repeatable; no DEVICE: on every device); by default "
                        "the largest count any instance asks for")


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


def scheduling_args(a: argparse.Namespace) -> list[str]:
    """The scheduling flags, as the supervisor passes them on to the router."""
    out = ["--max-queue-size", str(a.max_queue_size), "--rate-limit", a.rate_limit]
    for resource in a.rate_limit_resource:
        out += ["--rate-limit-resource", resource]
    return out


def add_model_control(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], default="none",
                   help="none: load every model at start; poll: also follow repository changes; "
                        "explicit: load what --load-model names and what the load API asks for")
    p.add_argument("--repository-poll-secs", type=float, default=15.0,
                   help="how often poll mode rescans the repositories")
    p.add_argument("--load-model", action="append", default=[], metavar="NAME",
                   help="explicit mode: load this model at start (repeatable; '*' for every model)")
    p.add_argument("--strict-model-config", type=triton_bool, default=False, metavar="BOOL",
                   help="never complete a config from the model file: config.pbtxt must declare inputs and outputs")
    p.add_argument("--disable-auto-complete-config", action="store_true",
                   help="as --strict-model-config=true (Triton's newer name)")
    p.add_argument("--exit-on-error", type=triton_bool, default=False, metavar="BOOL",
                   help="a model that fails to load at start-up stops the server with a non-zero exit code "
                        "(default false for 'conveyor serve', true for 'tritonserver', as Triton)")
    p.add_argument("--strict-readiness", type=triton_bool, default=False, metavar="BOOL",
                   help="ready only while every model is ready (true); false: once every load has settled, "
                        "failed or not (default false for 'conveyor serve', true for 'tritonserver', as Triton)")
    p.add_argument("--model-config-name", default="", metavar="NAME",
                   help="load <model>/configs/NAME.pbtxt where it exists instead of config.pbtxt")
    p.add_argument("--model-namespacing", type=triton_bool, default=False, metavar="BOOL",
                   help="each model repository is a namespace: several may hold a model of the same name, "
                        "an ensemble uses its own repository's, a request to a name held twice is refused")
    p.add_argument("--model-load-retry-count", type=int, default=0, metavar="N",
                   help="load a model instance that failed up to N more times before it counts as failed")
    p.add_argument("--model-load-thread-count", type=_load_threads, default=4, metavar="N",
                   help="threads the router prepares loads on (reading, completing and mirroring models): loads of "
                        "different models run in parallel, and every other model keeps serving (default 4)")
    p.add_argument("--backend-config", action="append", default=[], type=_checked(_backend_setting),
                   metavar="[BACKEND,]KEY=VALUE",
                   help="Triton's backend settings (repeatable): default-max-batch-size, onnxruntime's "
                        "intra_op_thread_count / inter_op_thread_count; others are accepted and logged")


def model_control_args(a: argparse.Namespace) -> list[str]:
    """The model-control flags, as the supervisor passes them on to the router."""
    out = ["--model-control-mode", a.model_control_mode, "--repository-poll-secs", str(a.repository_poll_secs),
           "--strict-model-config", str(a.strict_model_config or a.disable_auto_complete_config).lower(),
           "--exit-on-error", str(a.exit_on_error).lower(), "--strict-readiness", str(a.strict_readiness).lower(),
           "--model-load-retry-count", str(a.model_load_retry_count),
           "--model-load-thread-count", str(a.model_load_thread_count),
           "--model-namespacing", str(a.model_namespacing).lower()]
    if a.model_config_name:
        out += ["--model-config-name", a.model_config_name]
    for name in a.load_model:
        out += ["--load-model", name]
    for setting in a.backend_config:
        out += ["--backend-config", setting]
    return out


def restricted_group(text: str) -> RestrictedGroup:
    try:
        return parse_group(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_ingress_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-input-elements", type=int, default=DEFAULT_MAX_INPUT_ELEMENTS, metavar="N",
                   help="elements one input tensor may hold; more is refused with 400 / INVALID_ARGUMENT; 0: no limit "
                        f"(default {DEFAULT_MAX_INPUT_ELEMENTS})")
    p.add_argument("--max-json-bytes", type=int, default=DEFAULT_MAX_JSON_BYTES, metavar="BYTES",
                   help="largest JSON part of an HTTP request (JSON tensors take ~8x their text in memory); "
                        f"more is refused with 400; 0: no limit (default {DEFAULT_MAX_JSON_BYTES})")
    p.add_argument("--max-inflight-requests", type=int, default=DEFAULT_MAX_INFLIGHT, metavar="N",
                   help="requests one ingress process holds at once; more are refused with 503 / UNAVAILABLE "
                        f"'too many requests in flight'; 0: no limit (default {DEFAULT_MAX_INFLIGHT})")
    p.add_argument("--http-max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, metavar="BYTES",
                   help=f"largest HTTP request body, after decompression (default {DEFAULT_MAX_BODY_BYTES})")
    p.add_argument("--client-mistakes-as-400", type=triton_bool, default=False, metavar="BOOL",
                   help="answer the client mistakes Triton reports as 500 / INTERNAL (a model the repository does "
                        "not hold, a malformed shape, an unopenable shared-memory key) with 400 / INVALID_ARGUMENT "
                        "instead (default false: Triton's status, which its clients and QA assert)")
    # What one HTTP client may hold of an ingress process (ingress/http/edge.py says why each).
    p.add_argument("--http-max-connections", type=int, default=MAX_CONNECTIONS, metavar="N",
                   help="client connections one HTTP ingress process holds; past it the one waiting longest for a "
                        f"request is closed, or with none waiting the new one gets 503; 0: no limit "
                        f"(default {MAX_CONNECTIONS})")
    p.add_argument("--http-header-timeout-secs", type=float, default=HEADER_TIMEOUT_S, metavar="S",
                   help="a request head must arrive within this, from the connection or from its first byte; "
                        f"else 408 and the connection closes; 0: no limit (default {HEADER_TIMEOUT_S:g})")
    p.add_argument("--http-body-timeout-secs", type=float, default=BODY_TIMEOUT_S, metavar="S",
                   help="the longest silence while a request body is still due; then 408 and the connection "
                        f"closes; 0: no limit (default {BODY_TIMEOUT_S:g})")
    p.add_argument("--http-write-timeout-secs", type=float, default=WRITE_TIMEOUT_S, metavar="S",
                   help="how long a client may leave its answer unread once its send buffer is full (its "
                        f"connection is not read meanwhile); then it is dropped; 0: no limit "
                        f"(default {WRITE_TIMEOUT_S:g})")

    # The gRPC server on h2 (--grpc-server h2, the default): request bytes held before calls take them.
    p.add_argument("--grpc-max-buffer-bytes", type=int, default=DEFAULT_GRPC_BUFFER_BYTES, metavar="BYTES",
                   help="request message bytes one gRPC ingress process holds before their calls take them; the "
                        "stream past it ends with RESOURCE_EXHAUSTED; 0: no limit "
                        f"(default {DEFAULT_GRPC_BUFFER_BYTES}; --grpc-server h2)")
    p.add_argument("--grpc-max-connection-buffer-bytes", type=int, default=DEFAULT_GRPC_CONNECTION_BUFFER_BYTES,
                   metavar="BYTES",
                   help="the same per gRPC connection; a larger message is refused at its length prefix; 0: no "
                        f"limit but gRPC's 2 GiB (default {DEFAULT_GRPC_CONNECTION_BUFFER_BYTES}; --grpc-server h2)")


def http_edge(a: argparse.Namespace) -> EdgeLimits:
    """The HTTP edge limits the flags set."""
    return EdgeLimits(a.http_max_connections, a.http_header_timeout_secs, a.http_body_timeout_secs,
                      a.http_write_timeout_secs)


def add_ingress_security(p: argparse.ArgumentParser) -> None:
    """Triton's access-control and TLS flags, plus HTTPS (a Conveyor extension)."""
    p.add_argument("--http-restricted-api", action="append", default=[], type=restricted_group,
                   metavar="<api>,...:<key>=<value>",
                   help="HTTP requests to these APIs need header <key>: <value> (repeatable; APIs: health, metadata, "
                        "inference, shared-memory, model-config, model-repository, statistics, trace, logging)")
    p.add_argument("--grpc-restricted-protocol", action="append", default=[], type=restricted_group,
                   metavar="<protocol>,...:<key>=<value>",
                   help="gRPC calls to these protocols need metadata triton-grpc-protocol-<key>: <value> (repeatable)")
    p.add_argument("--grpc-use-ssl", type=triton_bool, default=False, metavar="BOOL", help="serve gRPC over TLS")
    p.add_argument("--grpc-use-ssl-mutual", type=triton_bool, default=False, metavar="BOOL",
                   help="serve gRPC over mutual TLS: clients need a certificate signed by --grpc-root-cert")
    p.add_argument("--grpc-server-cert", default="", metavar="PEM", help="the gRPC server's certificate (chain)")
    p.add_argument("--grpc-server-key", default="", metavar="PEM", help="the gRPC server's private key")
    p.add_argument("--grpc-root-cert", default="", metavar="PEM", help="the CA certificate client certificates need")
    p.add_argument("--http-ssl-cert", default="", metavar="PEM",
                   help="serve HTTPS with this certificate (a Conveyor extension: Triton serves plain HTTP)")
    p.add_argument("--http-ssl-key", default="", metavar="PEM", help="the HTTPS private key")
    p.add_argument("--http-header-forward-pattern", default="", metavar="REGEX",
                   help="request headers whose name matches become string request parameters (case-insensitive "
                        "unless the pattern starts with (?-i))")
    p.add_argument("--grpc-header-forward-pattern", default="", metavar="REGEX",
                   help="request metadata whose name matches become string request parameters")
    p.add_argument("--grpc-server", choices=("auto", "grpcio", "h2"),
                   default=os.environ.get("CONVEYOR_GRPC_SERVER", "auto"),
                   help="the gRPC server: h2 (on the event loop, over python-hyper's h2, with the HTTP/2 limits of "
                        "docs/SECURITY.md) or grpcio (grpc.aio); auto: h2 unless TLS or a --grpc-keepalive/http2 "
                        "flag asks for what only grpcio does. Default: $CONVEYOR_GRPC_SERVER, else auto")


def grpc_server_choice(a: argparse.Namespace) -> str:
    """Which gRPC server serves: h2 unless TLS or keepalive settings need grpcio (``--grpc-server auto``)."""
    if a.grpc_server != "auto":
        return str(a.grpc_server)
    if a.grpc_use_ssl or a.grpc_use_ssl_mutual:
        return "grpcio"
    if any(getattr(a, _dest(flag)) != default for flag, _arg, default in GRPC_KEEPALIVE):
        return "grpcio"  # server keepalive pings and the ping-abuse policy are grpcio's only
    return "h2"


def check_ingress_args(a: argparse.Namespace) -> str:
    """Why these ingress flags cannot work together, or ''."""
    from conveyor.ingress.header_forward import check_pattern
    from conveyor.ingress.restricted import restrictions

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


def ingress_args(a: argparse.Namespace) -> list[str]:
    """The limit, access and TLS flags, as the supervisor passes them on to ingress processes."""
    out = ["--max-input-elements", str(a.max_input_elements), "--max-inflight-requests", str(a.max_inflight_requests),
           "--max-json-bytes", str(a.max_json_bytes),
           "--http-max-body-bytes", str(a.http_max_body_bytes), "--http-max-connections", str(a.http_max_connections),
           "--http-header-timeout-secs", str(a.http_header_timeout_secs),
           "--http-body-timeout-secs", str(a.http_body_timeout_secs),
           "--http-write-timeout-secs", str(a.http_write_timeout_secs),
           "--client-mistakes-as-400", str(a.client_mistakes_as_400).lower(),
           "--grpc-max-buffer-bytes", str(a.grpc_max_buffer_bytes),
           "--grpc-max-connection-buffer-bytes", str(a.grpc_max_connection_buffer_bytes),
           "--grpc-use-ssl", str(a.grpc_use_ssl).lower(), "--grpc-use-ssl-mutual", str(a.grpc_use_ssl_mutual).lower(),
           "--grpc-server", a.grpc_server]
    for flag, groups in (("--http-restricted-api", a.http_restricted_api),
                         ("--grpc-restricted-protocol", a.grpc_restricted_protocol)):
        for g in groups:
            out += [flag, f"{','.join(g.categories)}:{g.key}={g.value}"]
    for flag, value in (("--grpc-server-cert", a.grpc_server_cert), ("--grpc-server-key", a.grpc_server_key),
                        ("--grpc-root-cert", a.grpc_root_cert), ("--http-ssl-cert", a.http_ssl_cert),
                        ("--http-ssl-key", a.http_ssl_key)):
        if value:
            out += [flag, os.path.abspath(value)]
    for flag, value in (("--http-header-forward-pattern", a.http_header_forward_pattern),
                        ("--grpc-header-forward-pattern", a.grpc_header_forward_pattern)):
        if value:
            out.append(f"{flag}={value}")  # one argument: a pattern may start with '-'
    return out


def add_metrics(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-cpu-metrics", type=triton_bool, default=True, metavar="BOOL")
    p.add_argument("--allow-gpu-metrics", type=triton_bool, default=True, metavar="BOOL")
    p.add_argument("--metrics-interval-ms", type=int, default=2000, metavar="MS",
                   help="how often CPU and GPU metrics are sampled")
    p.add_argument("--metrics-config", action="append", default=[], metavar="KEY=VALUE",
                   help="summary_latencies=<bool>, summary_quantiles=<q:err,...>, counter_latencies=<bool>, "
                        "histogram_latencies=<bool> (repeatable; Triton's flag)")


_METRICS_CONFIG_KEYS = ("summary_latencies", "summary_quantiles", "counter_latencies", "histogram_latencies")


def metrics_config(a: argparse.Namespace) -> dict[str, str]:
    """``--metrics-config`` as a dict; unknown keys are refused as Triton does."""
    out: dict[str, str] = {}
    for item in a.metrics_config:
        key, sep, value = item.partition("=")
        if not sep or key not in _METRICS_CONFIG_KEYS:
            raise ValueError(f"unknown --metrics-config '{item}' (keys: {', '.join(_METRICS_CONFIG_KEYS)})")
        out[key] = value
    return out


def metrics_args(a: argparse.Namespace) -> list[str]:
    """The metrics flags, as the supervisor passes them on to the router and the metrics process."""
    out = ["--allow-cpu-metrics", str(a.allow_cpu_metrics).lower(), "--allow-gpu-metrics",
           str(a.allow_gpu_metrics).lower(), "--metrics-interval-ms", str(a.metrics_interval_ms)]
    for item in a.metrics_config:
        out += ["--metrics-config", item]
    return out


def log_settings(a: argparse.Namespace) -> LogSettings:
    return LogSettings(a.log_file, a.log_info, a.log_warning, a.log_error, a.log_verbose, a.log_format)


def log_args(a: argparse.Namespace) -> list[str]:
    """The --log-* flags, as the supervisor passes them on to every child."""
    return ["--log-verbose", str(a.log_verbose), "--log-info", str(a.log_info).lower(),
            "--log-warning", str(a.log_warning).lower(), "--log-error", str(a.log_error).lower(),
            "--log-file", a.log_file, "--log-format", a.log_format]


def add_trace(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]KEY=VALUE",
                   help="rate=N, level=OFF|TIMESTAMPS|TENSORS, count=N, mode=triton|opentelemetry, "
                        "triton,file=PATH, triton,log-frequency=N, opentelemetry,url=HOST:PORT/v1/traces, "
                        "opentelemetry,resource=KEY=VALUE, opentelemetry,bsp_max_queue_size=N, "
                        "opentelemetry,bsp_schedule_delay=MS, opentelemetry,bsp_max_export_batch_size=N "
                        "(repeatable; Triton's flag)")
    # Triton's deprecated spellings: folded into --trace-config by triton_trace_config (as Triton does).
    p.add_argument("--trace-file", default=None, help="deprecated: --trace-config triton,file=PATH")
    p.add_argument("--trace-level", action="append", default=[], help="deprecated: --trace-config level=LEVEL")
    p.add_argument("--trace-rate", type=int, default=None, help="deprecated: --trace-config rate=N")
    p.add_argument("--trace-count", type=int, default=None, help="deprecated: --trace-config count=N")
    p.add_argument("--trace-log-frequency", type=int, default=None,
                   help="deprecated: --trace-config triton,log-frequency=N")


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
