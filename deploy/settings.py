"""Every setting of the command line, declared once: its flag (Triton's spelling where it is
Triton's), type, default, help text, the commands that take it and the actors that use it.

From this one table come the argument parsers of ``conveyor serve|router|ingress|worker`` and
of ``tritonserver`` (``build_options``), the command lines ``conveyor serve`` starts its children
with (``handoff``: a child gets exactly the settings its actor uses, as the flags of its own
parser, so ``conveyor router ...`` typed by hand reads the same), the Triton flags accepted but
not used (``unused``, ``deploy/triton_flags.py``) and docs/CLI.md (``deploy/cli_doc.py``
renders the parsers). Adding a flag is adding one ``Setting`` here and reading it in its actor;
``tests/deploy/test_settings.py`` fails when a setting a child uses does not reach it.

The parsed settings stay an ``argparse.Namespace``: its attribute names are the settings' dests.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from conveyor.deploy.flag_types import (
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

# The commands a setting is a flag of. "serve" is also ``tritonserver``: both start the same group.
SERVE, ROUTER, INGRESS, WORKER = "serve", "router", "ingress", "worker"
# Who reads a setting: the supervisor of ``conveyor serve``, or the children it is handed to.
SUPERVISOR = "supervisor"
CHILDREN = (ROUTER, WORKER, INGRESS)

_SAME = object()  # tritonserver's default is conveyor serve's


def _text(value: Any) -> str:
    """A value as its flag's text: booleans as Triton spells them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _path_text(value: Any) -> str:
    # A child may run in another folder: it gets the file the supervisor was given.
    return os.path.abspath(value) if value else ""


@dataclass(frozen=True)
class Setting:
    """One flag. ``flags`` are its spellings (the first names it; the rest are aliases)."""

    flags: tuple[str, ...]
    help: str
    kind: Callable[[str], Any] | None = None  # argparse's ``type``; None: the text as given
    default: Any = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    repeatable: bool = False  # each use adds a value (a list)
    switch: bool = False  # takes no value (store_true)
    dest: str = ""  # the Namespace attribute; default: the first flag's name
    # Who uses it: SUPERVISOR, and the children (ROUTER, WORKER, INGRESS) ``handoff`` passes it to.
    actors: frozenset[str] = frozenset({SUPERVISOR})
    # The commands that take it, beyond serve and the children it is handed to: accepted there and
    # not used (kept so that command lines written for them still run).
    also: frozenset[str] = frozenset()
    # A process's own flag, not serve's (its endpoints, its systemd instance): the commands that take it.
    only: frozenset[str] = frozenset()
    triton: bool = False  # one of tritonserver's own flags (its spellings are Triton's)
    triton_default: Any = _SAME  # tritonserver's default, where Triton's differs from conveyor serve's
    required: frozenset[str] = frozenset()  # the commands that refuse to run without it
    section: str = ""  # the argument group it is listed under ("": the command's options)
    env: str = ""  # the variable whose value, when set, is the default (parsed as the flag's text)
    default_from: Callable[[], Any] | None = None  # a default the environment decides otherwise
    unused: str = ""  # a Triton flag accepted and not used: why it changes nothing
    grpc_option: str = ""  # the grpc core channel argument it sets (Triton's grpc_server.cc)
    to_text: Callable[[Any], str] = _text  # a value back to the flag's text, for a child's command line

    @property
    def commands(self) -> frozenset[str]:
        """The commands that take it: serve (and tritonserver) and every child it is handed to,
        so that a child cannot be handed a flag its parser lacks, nor take one of serve's unused."""
        if self.only:
            return self.only
        return frozenset({SERVE}) | (self.actors & frozenset(CHILDREN)) | self.also

    @property
    def name(self) -> str:
        return self.dest or self.flags[0][2:].replace("-", "_")

    def default_now(self, triton: bool = False) -> Any:
        """The default for a parser built now (the environment read now)."""
        if triton and self.triton_default is not _SAME:
            return self.triton_default
        if self.default_from is not None:
            return self.default_from()
        if self.env and os.environ.get(self.env):
            text = os.environ[self.env]
            return self.kind(text) if self.kind is not None else text
        return list(self.default) if isinstance(self.default, list) else self.default  # a list of its own

    def add_to(self, p: argparse.ArgumentParser | argparse._ArgumentGroup, command: str, triton: bool) -> None:
        kwargs: dict[str, Any] = {"dest": self.name, "help": self.help}
        if self.switch:
            kwargs["action"] = "store_true"
        else:
            kwargs["default"] = self.default_now(triton)
            if self.kind is not None:
                kwargs["type"] = self.kind
            if self.metavar is not None:
                kwargs["metavar"] = self.metavar
            if self.choices is not None:
                kwargs["choices"] = list(self.choices)
            if self.repeatable:
                kwargs["action"] = "append"
        if command in self.required:
            kwargs["required"] = True
        p.add_argument(*self.flags, **kwargs)

    def argv(self, value: Any) -> list[str]:
        """The flag and its value(s) on a child's command line; nothing for an unset value."""
        if value is None:
            return []
        if self.switch:
            return [self.flags[0]] if value else []
        values = value if self.repeatable else [value]
        out: list[str] = []
        for v in values:
            text = self.to_text(v)
            # One argument when the text could read as a flag of its own (a pattern, a negative number).
            out += [f"{self.flags[0]}={text}"] if text.startswith("-") else [self.flags[0], text]
        return out


def _cmds(*names: str) -> frozenset[str]:
    return frozenset(names)


_EVERY_CHILD = _cmds(SUPERVISOR, *CHILDREN)
_TO_INGRESS = _cmds(INGRESS)
_TO_ROUTER = _cmds(ROUTER)


def _vertex_mode() -> bool:
    return os.environ.get("AIP_MODE", "") == "PREDICTION"


def _off_in_vertex_mode() -> bool:
    # AIP_MODE=PREDICTION: Vertex AI's endpoint serves, HTTP and gRPC are off unless asked for.
    return not _vertex_mode()


_CLOUD = "SageMaker and Vertex AI endpoints"
_OPENAI = "OpenAI-compatible endpoint"
_UNUSED = "Triton flags accepted but not used (logged once at start, with the reason)"


def _grpc_keepalive(flag: str, option: str, default: int | None, help_extra: str = "") -> Setting:
    boolean = flag.endswith("without-calls")
    return Setting((flag,), f"Triton's flag: sets the gRPC server's {option}{help_extra}",
                   kind=triton_bool_int if boolean else int, default=default, metavar="BOOL" if boolean else "MS",
                   actors=_TO_INGRESS, triton=True, grpc_option=option)


def _unused(flag: str, kind: Callable[[str], Any], reason: str, repeatable: bool = False) -> Setting:
    return Setting((flag,), f"not used: {reason}", kind=kind, metavar="VALUE", repeatable=repeatable,
                   dest="unused_" + flag[2:].replace("-", "_"), triton=True, section=_UNUSED, unused=reason)


_THREADS = "each ingress process is one event loop; scale them with --http-ingress / --grpc-ingress instead"
_GPU_POOL = ("each backend allocates GPU memory through its own framework (ONNX Runtime, PyTorch, TensorRT) "
             "and tensors cross processes in shared memory: the server keeps no pool of its own")

SETTINGS: tuple[Setting, ...] = (
    # --- every process -------------------------------------------------------------------
    Setting(("--group",), "name of this process group: shared-memory names and IPC paths carry it (default: "
            "'default'; 'conveyor serve' takes 'default-2', ... when that one is running)",
            actors=_EVERY_CHILD),
    Setting(("--log-verbose",), "verbose logging level (Triton's flag)", kind=triton_int_bool, default=0,
            actors=_EVERY_CHILD, triton=True),
    Setting(("--log-info",), "log informational messages", kind=triton_bool, default=True, metavar="BOOL",
            actors=_EVERY_CHILD, triton=True),
    Setting(("--log-warning",), "log warnings", kind=triton_bool, default=True, metavar="BOOL",
            actors=_EVERY_CHILD, triton=True),
    Setting(("--log-error",), "log errors", kind=triton_bool, default=True, metavar="BOOL",
            actors=_EVERY_CHILD, triton=True),
    Setting(("--log-file",), "append the log here instead of stderr (every process of the group)", default="",
            actors=_EVERY_CHILD, triton=True),
    Setting(("--log-format",), "the log line's layout: default (Triton's glog-like lines) or ISO8601 timestamps",
            default="default", choices=("default", "ISO8601"), actors=_EVERY_CHILD, triton=True),
    Setting(("--spin-us",), "router and workers spin this long on their sockets before sleeping (0 = never); "
            "default auto: 50 on hosts with 8 or more cores, else 0 (deploy/runtime/polling.py)",
            metavar="US|auto", actors=_EVERY_CHILD),
    # $CONVEYOR_IO_SCHED and $CONVEYOR_DISPATCH_CPU are read by the actor when the flag is not given.
    Setting(("--io-sched",), "scheduling policy of each process's ZeroMQ I/O thread; default batch (SCHED_BATCH: it "
            "does not preempt the actor that woke it; deploy/runtime/io_threads.py), or $CONVEYOR_IO_SCHED",
            choices=("batch", "normal"), actors=_EVERY_CHILD),
    Setting(("--dispatch-cpu",), "the core the router and each worker's main thread share; default auto: the last "
            "CPU on hosts with 2 CPUs, none on larger ones (deploy/runtime/dispatch_cpu.py), or $CONVEYOR_DISPATCH_CPU",
            kind=checked(dispatch_cpu_text), metavar="auto|off|CPU", actors=_EVERY_CHILD),
    Setting(("--exit-timeout-secs",), "how long shutdown waits for in-flight requests", kind=float, default=30.0,
            actors=_EVERY_CHILD, triton=True),
    # Not handed to the router: Supervisor._router_child gives it 0, for it stops after the ingress,
    # which carry the grace.
    Setting(("--drain-grace-secs",), "on SIGTERM, how long readiness reads false while requests are still served, "
            "so load balancers stop sending first; then new requests get UNAVAILABLE and in-flight ones get "
            "--exit-timeout-secs to finish", kind=float, default=5.0, triton_default=0.0,
            actors=_cmds(SUPERVISOR, INGRESS), also=_cmds(ROUTER)),
    # --- the network ---------------------------------------------------------------------
    Setting(("--http-port",), "the HTTP/REST port (KServe v2)", kind=int, default=8000,
            actors=_cmds(SUPERVISOR, INGRESS), triton=True),
    Setting(("--grpc-port",), "the gRPC port (KServe v2)", kind=int, default=8001,
            actors=_cmds(SUPERVISOR, INGRESS), triton=True),
    Setting(("--metrics-port",), "the Prometheus /metrics port", kind=int, default=8002,
            actors=_cmds(SUPERVISOR, INGRESS), triton=True),
    Setting(("--http-address",), "the address the HTTP port listens on", default="0.0.0.0",
            actors=_cmds(SUPERVISOR, INGRESS), triton=True),
    Setting(("--grpc-address",), "the address the gRPC port listens on", default="0.0.0.0",
            actors=_cmds(SUPERVISOR, INGRESS), triton=True),
    Setting(("--allow-http",), "serve HTTP (default true; false when AIP_MODE=PREDICTION)", kind=triton_bool,
            default=True, default_from=_off_in_vertex_mode, metavar="BOOL", triton=True, also=_cmds(INGRESS)),
    Setting(("--allow-grpc",), "serve gRPC (default true; false when AIP_MODE=PREDICTION)", kind=triton_bool,
            default=True, default_from=_off_in_vertex_mode, metavar="BOOL", triton=True, also=_cmds(INGRESS)),
    Setting(("--allow-metrics",), "serve Prometheus metrics on --metrics-port", kind=triton_bool, default=True,
            metavar="BOOL", triton=True, also=_cmds(INGRESS)),
    Setting(("--arena-size",), "bytes of each process's shared-memory arena (tmpfs: only touched pages count)",
            kind=int, default=256 << 20, actors=_cmds(SUPERVISOR, INGRESS, WORKER)),
    Setting(("--metrics-address",), "where /metrics listens (default: --http-address)", default="",
            actors=_cmds(SUPERVISOR, INGRESS), triton=True),
    Setting(("--id",), "the server name server metadata reports", default="triton", dest="server_id",
            actors=_TO_INGRESS, triton=True),
    _grpc_keepalive("--grpc-keepalive-time", "grpc.keepalive_time_ms", 7200000),
    _grpc_keepalive("--grpc-keepalive-timeout", "grpc.keepalive_timeout_ms", 20000),
    _grpc_keepalive("--grpc-keepalive-permit-without-calls", "grpc.keepalive_permit_without_calls", 0),
    _grpc_keepalive("--grpc-http2-max-pings-without-data", "grpc.http2.max_pings_without_data", 2),
    _grpc_keepalive("--grpc-http2-min-recv-ping-interval-without-data",
                    "grpc.http2.min_ping_interval_without_data_ms", 300000),
    _grpc_keepalive("--grpc-http2-max-ping-strikes", "grpc.http2.max_ping_strikes", 2),
    _grpc_keepalive("--grpc-max-connection-age", "grpc.max_connection_age_ms", None),  # None: unset, as Triton
    _grpc_keepalive("--grpc-max-connection-age-grace", "grpc.max_connection_age_grace_ms", None),
    # --- what one ingress process takes of a client --------------------------------------
    Setting(("--max-input-elements",), "elements one input tensor may hold; more is refused with 400 / "
            f"INVALID_ARGUMENT; 0: no limit (default {DEFAULT_MAX_INPUT_ELEMENTS})",
            kind=int, default=DEFAULT_MAX_INPUT_ELEMENTS, metavar="N", actors=_TO_INGRESS),
    Setting(("--max-json-bytes",), "largest JSON part of an HTTP request (JSON tensors take ~8x their text in "
            f"memory); more is refused with 400; 0: no limit (default {DEFAULT_MAX_JSON_BYTES})",
            kind=int, default=DEFAULT_MAX_JSON_BYTES, metavar="BYTES", actors=_TO_INGRESS),
    Setting(("--max-inflight-requests",), "requests one ingress process holds at once; more are refused with 503 / "
            f"UNAVAILABLE 'too many requests in flight'; 0: no limit (default {DEFAULT_MAX_INFLIGHT})",
            kind=int, default=DEFAULT_MAX_INFLIGHT, metavar="N", actors=_TO_INGRESS),
    Setting(("--http-max-body-bytes",), f"largest HTTP request body, after decompression "
            f"(default {DEFAULT_MAX_BODY_BYTES})",
            kind=int, default=DEFAULT_MAX_BODY_BYTES, metavar="BYTES", actors=_TO_INGRESS),
    Setting(("--client-mistakes-as-400",), "answer the client mistakes Triton reports as 500 / INTERNAL (a model "
            "the repository does not hold, a malformed shape, an unopenable shared-memory key) with 400 / "
            "INVALID_ARGUMENT instead (default false: Triton's status, which its clients and QA assert)",
            kind=triton_bool, default=False, metavar="BOOL", actors=_TO_INGRESS),
    # What one HTTP client may hold of an ingress process (ingress/http/edge.py says why each).
    Setting(("--http-max-connections",), "client connections one HTTP ingress process holds; past it the one "
            "waiting longest for a request is closed, or with none waiting the new one gets 503; 0: no limit "
            f"(default {MAX_CONNECTIONS})",
            kind=int, default=MAX_CONNECTIONS, metavar="N", actors=_TO_INGRESS),
    Setting(("--http-header-timeout-secs",), "a request head must arrive within this, from the connection or from "
            f"its first byte; else 408 and the connection closes; 0: no limit (default {HEADER_TIMEOUT_S:g})",
            kind=float, default=HEADER_TIMEOUT_S, metavar="S", actors=_TO_INGRESS),
    Setting(("--http-body-timeout-secs",), "the longest silence while a request body is still due; then 408 and "
            f"the connection closes; 0: no limit (default {BODY_TIMEOUT_S:g})",
            kind=float, default=BODY_TIMEOUT_S, metavar="S", actors=_TO_INGRESS),
    Setting(("--http-write-timeout-secs",), "how long a client may leave its answer unread once its send buffer is "
            "full (its connection is not read meanwhile); then it is dropped; 0: no limit "
            f"(default {WRITE_TIMEOUT_S:g})",
            kind=float, default=WRITE_TIMEOUT_S, metavar="S", actors=_TO_INGRESS),
    # The gRPC server on h2 (--grpc-server h2, the default): request bytes held before calls take them.
    Setting(("--grpc-max-buffer-bytes",), "request message bytes one gRPC ingress process holds before their calls "
            "take them; the stream past it ends with RESOURCE_EXHAUSTED; 0: no limit "
            f"(default {DEFAULT_GRPC_BUFFER_BYTES}; --grpc-server h2)",
            kind=int, default=DEFAULT_GRPC_BUFFER_BYTES, metavar="BYTES", actors=_TO_INGRESS),
    Setting(("--grpc-max-connection-buffer-bytes",), "the same per gRPC connection; a larger message is refused at "
            f"its length prefix; 0: no limit but gRPC's 2 GiB (default {DEFAULT_GRPC_CONNECTION_BUFFER_BYTES}; "
            "--grpc-server h2)", kind=int, default=DEFAULT_GRPC_CONNECTION_BUFFER_BYTES, metavar="BYTES",
            actors=_TO_INGRESS),
    # --- access control and TLS (Triton's), plus HTTPS (a Conveyor extension) --------------
    Setting(("--http-restricted-api",), "HTTP requests to these APIs need header <key>: <value> (repeatable; APIs: "
            "health, metadata, inference, shared-memory, model-config, model-repository, statistics, trace, logging)",
            kind=restricted_group, default=[], repeatable=True, metavar="<api>,...:<key>=<value>",
            actors=_TO_INGRESS, triton=True, to_text=restricted_text),
    Setting(("--grpc-restricted-protocol",), "gRPC calls to these protocols need metadata "
            "triton-grpc-protocol-<key>: <value> (repeatable)",
            kind=restricted_group, default=[], repeatable=True, metavar="<protocol>,...:<key>=<value>",
            actors=_TO_INGRESS, triton=True, to_text=restricted_text),
    Setting(("--grpc-use-ssl",), "serve gRPC over TLS", kind=triton_bool, default=False, metavar="BOOL",
            actors=_TO_INGRESS, triton=True),
    Setting(("--grpc-use-ssl-mutual",), "serve gRPC over mutual TLS: clients need a certificate signed by "
            "--grpc-root-cert", kind=triton_bool, default=False, metavar="BOOL",
            actors=_TO_INGRESS, triton=True),
    Setting(("--grpc-server-cert",), "the gRPC server's certificate (chain)", default="", metavar="PEM",
            actors=_TO_INGRESS, triton=True, to_text=_path_text),
    Setting(("--grpc-server-key",), "the gRPC server's private key", default="", metavar="PEM",
            actors=_TO_INGRESS, triton=True, to_text=_path_text),
    Setting(("--grpc-root-cert",), "the CA certificate client certificates need", default="", metavar="PEM",
            actors=_TO_INGRESS, triton=True, to_text=_path_text),
    Setting(("--http-ssl-cert",), "serve HTTPS with this certificate (a Conveyor extension: Triton serves plain "
            "HTTP)", default="", metavar="PEM", actors=_TO_INGRESS, to_text=_path_text),
    Setting(("--http-ssl-key",), "the HTTPS private key", default="", metavar="PEM",
            actors=_TO_INGRESS, to_text=_path_text),
    Setting(("--http-header-forward-pattern",), "request headers whose name matches become string request "
            "parameters (case-insensitive unless the pattern starts with (?-i))", default="", metavar="REGEX",
            actors=_TO_INGRESS, triton=True),
    Setting(("--grpc-header-forward-pattern",), "request metadata whose name matches become string request "
            "parameters", default="", metavar="REGEX", actors=_TO_INGRESS, triton=True),
    Setting(("--grpc-server",), "the gRPC server: h2 (on the event loop, over python-hyper's h2, with the HTTP/2 "
            "limits of docs/SECURITY.md) or grpcio (grpc.aio); auto: h2 unless TLS or a --grpc-keepalive/http2 "
            "flag asks for what only grpcio does. Default: $CONVEYOR_GRPC_SERVER, else auto",
            default="auto", env="CONVEYOR_GRPC_SERVER", choices=("auto", "grpcio", "h2"),
            actors=_TO_INGRESS),
    # --- the repository --------------------------------------------------------------------
    # The router gets the repositories the supervisor serves (the example one when none is given).
    Setting(("--model-repository", "--model-store"), "a Triton model repository (repeatable)",
            default=[], repeatable=True, actors=_cmds(SUPERVISOR, ROUTER), triton=True,
            required=_cmds(ROUTER)),
    # --- scheduling --------------------------------------------------------------------------
    Setting(("--cache-config",), "Triton's response cache: models with response_cache { enable: true } are "
            "answered from a cache of this many bytes of outputs (off by default)",
            kind=cache_config, default=[], repeatable=True, metavar="local,size=BYTES",
            actors=_TO_ROUTER, triton=True),
    # Folded into --cache-config as it is parsed (options.fold_response_cache_size): nothing left to pass on.
    Setting(("--response-cache-byte-size",), "deprecated (Triton's): --cache-config local,size=BYTES",
            kind=int, metavar="BYTES", actors=_TO_ROUTER, triton=True),
    Setting(("--max-queue-size",), "requests one model version may hold queued before new ones are refused with "
            "'Exceeds maximum queue size' (503 / UNAVAILABLE), whatever its config says; 0: no cap "
            f"(default {DEFAULT_QUEUE_CAP})", kind=int, default=DEFAULT_QUEUE_CAP, metavar="N",
            actors=_TO_ROUTER),
    Setting(("--rate-limit",), "execution_count: an instance runs only when the resources its instance_group's "
            "rate_limiter lists are free (Triton's rate limiter); off: ignore rate_limiter",
            default="off", choices=("off", "execution_count"), actors=_TO_ROUTER, triton=True),
    Setting(("--rate-limit-resource",), "copies of a rate-limiter resource (repeatable; no DEVICE: on every "
            "device); by default the largest count any instance asks for",
            kind=resource_limit, default=[], repeatable=True, metavar="NAME:COUNT[:DEVICE]",
            actors=_TO_ROUTER, triton=True),
    # --- metrics: the router keeps them, the metrics ingress serves them ----------------------
    # Every ingress process is handed them (it parses them as the metrics one does); only the
    # metrics process (--protocol metrics) reads them.
    Setting(("--allow-cpu-metrics",), "report CPU utilization and memory in /metrics", kind=triton_bool,
            default=True, metavar="BOOL", actors=_cmds(ROUTER, INGRESS), triton=True),
    Setting(("--allow-gpu-metrics",), "report GPU utilization, memory and power in /metrics", kind=triton_bool,
            default=True, metavar="BOOL", actors=_cmds(ROUTER, INGRESS), triton=True),
    Setting(("--metrics-interval-ms",), "how often CPU and GPU metrics are sampled", kind=int, default=2000,
            metavar="MS", actors=_cmds(ROUTER, INGRESS), triton=True),
    Setting(("--metrics-config",), "summary_latencies=<bool>, summary_quantiles=<q:err,...>, "
            "counter_latencies=<bool>, histogram_latencies=<bool> (repeatable; Triton's flag)",
            default=[], repeatable=True, metavar="KEY=VALUE",
            actors=_cmds(ROUTER, INGRESS), triton=True),
    # --- tracing -------------------------------------------------------------------------------
    Setting(("--trace-config",), "rate=N, level=OFF|TIMESTAMPS|TENSORS, count=N, mode=triton|opentelemetry, "
            "triton,file=PATH, triton,log-frequency=N, opentelemetry,url=HOST:PORT/v1/traces, "
            "opentelemetry,resource=KEY=VALUE, opentelemetry,bsp_max_queue_size=N, "
            "opentelemetry,bsp_schedule_delay=MS, opentelemetry,bsp_max_export_batch_size=N "
            "(repeatable; Triton's flag)", default=[], repeatable=True, metavar="[MODE,]KEY=VALUE",
            actors=_TO_ROUTER, triton=True),
    # Triton's deprecated spellings: folded into --trace-config as they are parsed (options.fold_deprecated_trace).
    Setting(("--trace-file",), "deprecated: --trace-config triton,file=PATH",
            actors=_TO_ROUTER, triton=True),
    Setting(("--trace-level",), "deprecated: --trace-config level=LEVEL", default=[], repeatable=True,
            actors=_TO_ROUTER, triton=True),
    Setting(("--trace-rate",), "deprecated: --trace-config rate=N", kind=int,
            actors=_TO_ROUTER, triton=True),
    Setting(("--trace-count",), "deprecated: --trace-config count=N", kind=int,
            actors=_TO_ROUTER, triton=True),
    Setting(("--trace-log-frequency",), "deprecated: --trace-config triton,log-frequency=N", kind=int,
            actors=_TO_ROUTER, triton=True),
    # --- the router process's own (a child of conveyor serve finds them from --group) ----------
    Setting(("--ingress-endpoint",), "ZeroMQ endpoint ingress processes connect to", default="",
            only=_cmds(ROUTER)),
    Setting(("--worker-endpoint",), "ZeroMQ endpoint workers connect to", default="",
            only=_cmds(ROUTER)),
    # --- how many of each process conveyor serve runs -------------------------------------------
    Setting(("--workers",), "worker processes", kind=int, default=2),
    Setting(("--http-ingress",), "HTTP ingress processes", kind=int, default=1),
    Setting(("--grpc-ingress",), "gRPC ingress processes", kind=int, default=1),
    # --- client shared memory --------------------------------------------------------------------
    # Triton 2.5x has no switch for it: tritonserver lets clients register, as Triton does.
    Setting(("--allow-client-shm",), "let clients register system/CUDA shared-memory regions (off by default, as "
            "in Triton: a client may name any segment the server's user can open)",
            kind=triton_bool, default=False, triton_default=True, metavar="BOOL", actors=_TO_ROUTER),
    Setting(("--max-client-shm-regions",), "shared-memory regions clients may hold registered at once; past it a "
            "registration is refused with 503 / UNAVAILABLE; 0: no limit "
            f"(default {DEFAULT_MAX_REGIONS})", kind=int, default=DEFAULT_MAX_REGIONS, metavar="N",
            actors=_TO_ROUTER),
    # --- model control ---------------------------------------------------------------------------
    Setting(("--model-control-mode",), "none: load every model at start; poll: also follow repository changes; "
            "explicit: load what --load-model names and what the load API asks for",
            default="none", choices=("none", "poll", "explicit"), actors=_TO_ROUTER, triton=True),
    Setting(("--repository-poll-secs",), "how often poll mode rescans the repositories", kind=float, default=15.0,
            actors=_TO_ROUTER, triton=True),
    Setting(("--load-model",), "explicit mode: load this model at start (repeatable; '*' for every model)",
            default=[], repeatable=True, metavar="NAME", actors=_TO_ROUTER, triton=True),
    Setting(("--strict-model-config",), "never complete a config from the model file: config.pbtxt must declare "
            "inputs and outputs", kind=triton_bool, default=False, metavar="BOOL",
            actors=_TO_ROUTER, triton=True),
    Setting(("--disable-auto-complete-config",), "as --strict-model-config=true (Triton's newer name)",
            switch=True, default=False, actors=_TO_ROUTER, triton=True),
    # Model Analyzer and Triton's tests expect Triton's defaults from tritonserver.
    Setting(("--exit-on-error",), "a model that fails to load at start-up stops the server with a non-zero exit "
            "code (default false for 'conveyor serve', true for 'tritonserver', as Triton)",
            kind=triton_bool, default=False, triton_default=True, metavar="BOOL",
            actors=_TO_ROUTER, triton=True),
    Setting(("--strict-readiness",), "ready only while every model is ready (true); false: once every load has "
            "settled, failed or not (default false for 'conveyor serve', true for 'tritonserver', as Triton)",
            kind=triton_bool, default=False, triton_default=True, metavar="BOOL",
            actors=_TO_ROUTER, triton=True),
    Setting(("--model-config-name",), "load <model>/configs/NAME.pbtxt where it exists instead of config.pbtxt",
            default="", metavar="NAME", actors=_TO_ROUTER, triton=True),
    Setting(("--model-namespacing",), "each model repository is a namespace: several may hold a model of the same "
            "name, an ensemble uses its own repository's, a request to a name held twice is refused",
            kind=triton_bool, default=False, metavar="BOOL", actors=_TO_ROUTER, triton=True),
    Setting(("--model-load-retry-count",), "load a model instance that failed up to N more times before it counts "
            "as failed", kind=int, default=0, metavar="N", actors=_TO_ROUTER, triton=True),
    Setting(("--model-load-thread-count",), "threads the router prepares loads on (reading, completing and "
            "mirroring models): loads of different models run in parallel, and every other model keeps serving "
            "(default 4)", kind=load_threads, default=4, metavar="N", actors=_TO_ROUTER, triton=True),
    Setting(("--backend-config",), "Triton's backend settings (repeatable): default-max-batch-size, onnxruntime's "
            "intra_op_thread_count / inter_op_thread_count; others are accepted and logged",
            kind=checked(backend_setting), default=[], repeatable=True, metavar="[BACKEND,]KEY=VALUE",
            actors=_cmds(SUPERVISOR, ROUTER), triton=True),
    # --- SageMaker and Vertex AI (deploy/cloud_options.py checks them; as Triton's command_line_parser.cc) --
    Setting(("--allow-sagemaker",), "serve SageMaker's /ping, /invocations and /models on --sagemaker-port "
            "(default false)", kind=triton_bool, default=False, metavar="BOOL", triton=True,
            section=_CLOUD, also=_cmds(INGRESS)),
    Setting(("--sagemaker-port",), "the SageMaker endpoint's port (default 8080)", kind=int, default=8080,
            actors=_cmds(SUPERVISOR, INGRESS), triton=True, section=_CLOUD),
    Setting(("--sagemaker-safe-port-range",), "the ports the other endpoints must use when SageMaker is on",
            kind=port_range, metavar="<integer>-<integer>", triton=True, section=_CLOUD, also=_cmds(INGRESS)),
    Setting(("--allow-vertex-ai",), "serve Vertex AI's AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE on --vertex-ai-port "
            "(default true when AIP_MODE=PREDICTION, which also turns HTTP and gRPC off by default)",
            kind=triton_bool, default=False, default_from=_vertex_mode, metavar="BOOL", triton=True,
            section=_CLOUD, also=_cmds(INGRESS)),
    Setting(("--vertex-ai-port",), "the Vertex AI endpoint's port (default AIP_HTTP_PORT, else 8080)",
            kind=int, default=8080, env="AIP_HTTP_PORT", actors=_cmds(SUPERVISOR, INGRESS),
            triton=True, section=_CLOUD),
    Setting(("--vertex-ai-default-model",), "the model AIP_PREDICT_ROUTE infers (default: the repository's only "
            "model)", default="", metavar="NAME", actors=_TO_INGRESS, triton=True, section=_CLOUD),
    # --- the OpenAI-compatible endpoint: off unless --openai-port is given. --lora-separator and
    # --default-max-tokens are the flags of Triton's OpenAI frontend (python/openai/openai_frontend/main.py).
    Setting(("--openai-port",), "serve /v1/models, /v1/completions and /v1/chat/completions on this port "
            "(default: off)", kind=int, default=0, actors=_cmds(SUPERVISOR, INGRESS),
            section=_OPENAI),
    Setting(("--openai-address",), "the OpenAI endpoint's address (default: --http-address)", default="",
            actors=_cmds(SUPERVISOR, INGRESS), section=_OPENAI),
    Setting(("--openai-ingress",), "OpenAI ingress processes (conveyor scale openai-ingress N)", kind=int,
            default=1, section=_OPENAI, also=_cmds(INGRESS)),
    Setting(("--lora-separator",), "a model name '<model><separator><adapter>' picks one of the model's LoRA "
            "adapters (Triton's flag; default: off)", default="", actors=_TO_INGRESS,
            section=_OPENAI),
    Setting(("--default-max-tokens",), "max_tokens of a request that sets none (default 16, as Triton's OpenAI "
            "frontend)", kind=int, default=16, actors=_TO_INGRESS, section=_OPENAI),
    # --- Triton's flags with no work to do in Conveyor's design: accepted so that an existing
    # tritonserver command line runs as it is, and logged once at start with the reason.
    _unused("--enable-peer-access", triton_bool,
            "tensors travel between processes through shared memory and CUDA IPC, never GPU peer copies"),
    _unused("--reuse-http-port", triton_bool,
            "every HTTP ingress process already binds with SO_REUSEPORT: that is how several share a port"),
    _unused("--reuse-grpc-port", triton_bool,
            "every gRPC ingress process already binds with SO_REUSEPORT: that is how several share a port"),
    _unused("--http-thread-count", int, _THREADS),
    _unused("--grpc-infer-allocation-pool-size", int,
            "requests are not pooled objects: each is a descriptor decoded from the wire, its tensors in the "
            "ingress's shared-memory arena"),
    _unused("--grpc-infer-response-compression-level", str,
            "responses are sent uncompressed unless the client asks for a compression algorithm on its call"),
    _unused("--backend-directory", str,
            "backends are Python modules inside Conveyor (onnxruntime, python, pytorch, tensorrt): "
            "no shared libraries are searched"),
    _unused("--repoagent-directory", str,
            "repository agents (model_repository_agents) are not run: no agent libraries are loaded"),
    _unused("--cache-directory", str, "the response cache is built into the router: no cache library is loaded"),
    _unused("--pinned-memory-pool-byte-size", int,
            "tensors live in POSIX shared-memory arenas (--arena-size); no pinned staging pool sits between "
            "them and the GPU"),
    _unused("--cuda-memory-pool-byte-size", str, _GPU_POOL, repeatable=True),
    _unused("--cuda-virtual-address-size", str,
            "implicit sequence state lives in each worker's memory, not in growable CUDA virtual memory",
            repeatable=True),
    _unused("--min-supported-compute-capability", float,
            "GPUs are chosen by CUDA_VISIBLE_DEVICES and the instance groups; workers do not filter devices by "
            "compute capability"),
    _unused("--buffer-manager-thread-count", int,
            "inputs and outputs are copied by the process that holds them, on its own thread: "
            "there is no buffer manager"),
    _unused("--host-policy", str,
            "the server pins no process to NUMA nodes or cores: pin workers with numactl/taskset or systemd's "
            "CPUAffinity=/NUMAPolicy=", repeatable=True),
    _unused("--model-load-gpu-limit", str,
            "loads are not refused on GPU memory use: each worker's framework reports out-of-memory as a "
            "failed load", repeatable=True),
    # The cloud endpoints run as one event loop each.
    _unused("--sagemaker-thread-count", int, _THREADS),
    _unused("--vertex-ai-thread-count", int, _THREADS),
    # --- one process's own: what the supervisor sets per child, or a systemd unit per instance ----
    Setting(("--protocol",), "what this ingress process serves (the supervisor runs one process per protocol)",
            default="", choices=INGRESS_PROTOCOLS,
            only=_cmds(INGRESS)),
    Setting(("--instance",), "a systemd instance name, <protocol>-<index> (http-0, grpc-1): sets --protocol",
            default="", only=_cmds(INGRESS)),
    Setting(("--router",), "the router's ingress endpoint", default="", only=_cmds(INGRESS)),
    Setting(("--router",), "the router's worker endpoint", default="", only=_cmds(WORKER)),
    Setting(("--ingress-endpoint",), "the router's ingress endpoint, for BLS requests from models", default="",
            only=_cmds(WORKER)),
    Setting(("--instance",), "a systemd instance name: an index (0, 1, ...) or gpu<N> (sees only GPU N)",
            default="", only=_cmds(WORKER)),
)


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


def handoff(a: argparse.Namespace, actor: str, overrides: Mapping[str, Any] | None = None) -> list[str]:
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

