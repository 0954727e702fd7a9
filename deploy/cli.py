"""``conveyor``: serve the whole process group, or run one actor (what systemd runs)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from conveyor.deploy.cloud_options import check_cloud_args, fold_storage_uri
from conveyor.deploy.group_lock import DEFAULT_GROUP, check_name
from conveyor.deploy.instances import ingress_protocol, worker_environment
from conveyor.deploy.lifeline import die_with_supervisor, mark_group_member
from conveyor.deploy.listen import endpoint, is_bind_failure
from conveyor.deploy.logs import setup_logging
from conveyor.deploy.openai_frontend import add_frontend_flags, frontend_main
from conveyor.deploy.options import (
    check_ingress_args,
    default_endpoints,
    fold_deprecated_trace,
    fold_http_max_input_size,
    fold_response_cache_size,
    grpc_keepalive_options,
    grpc_left_open,
    grpc_server_choice,
    http_edge,
    http_rules,
    log_settings,
    metrics_config,
    metrics_rules,
    openai_rules,
)
from conveyor.deploy.runtime.dispatch_cpu import dispatch_cpu, pin_dispatch
from conveyor.deploy.runtime.heap import keep_freed_heap
from conveyor.deploy.runtime.io_threads import configure_io_threads
from conveyor.deploy.runtime.leaving import exit_now
from conveyor.deploy.scale import ROLES
from conveyor.deploy.settings import (
    INGRESS,
    ROUTER,
    SERVE,
    WORKER,
    Answers,
    CloudIngressSettings,
    EveryProcess,
    GrpcIngressSettings,
    HttpIngressSettings,
    IngressSettings,
    Metrics,
    MetricsIngressSettings,
    OpenAiIngressSettings,
    RequestLimits,
    RouterSettings,
    ServeSettings,
    Tracing,
    WorkerSettings,
    build_options,
)
from conveyor.deploy.triton_flags import gpu_limit_problem, log_unused
from conveyor.ingress.header_forward import header_forward
from conveyor.ingress.limits import IngressLimits
from conveyor.ingress.restricted import GRPC_HEADER_PREFIX, restrictions
from conveyor.proto.errors import ConveyorError, invalid_arg, triton_line
from conveyor.proto.exit_codes import GROUP_BUSY_CODE, LISTEN_FAILED_CODE
from conveyor.proto.triton_cli import TRITON_CLI_ENV
from conveyor.router.observability.histograms import parse_quantiles
from conveyor.router.observability.trace_settings import parse_trace_config

log = logging.getLogger("conveyor.cli")
OPENAI_FRONTEND = "openai-frontend"
# Triton's refusal of --load-model '*' beside other names (its ModelRepositoryManager::Create).
WILDCARD_ALONE = "Wildcard model name '*' must be the ONLY startup model if specified at all."


def _limits(args: RequestLimits, forward_pattern: str = "") -> IngressLimits:
    return IngressLimits(args.max_input_elements, args.max_inflight_requests, args.max_json_bytes,
                         header_forward(forward_pattern))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="conveyor", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    # Each command's flags are the settings declared for it (deploy/settings.py).
    for command, about in ((SERVE, "run router, ingress and workers in the foreground"),
                           (ROUTER, "run the router"), (INGRESS, "run one ingress process"),
                           (WORKER, "run one worker process")):
        build_options(sub.add_parser(command, help=about), command)
    # Triton's OpenAI frontend's command line (python/openai/openai_frontend/main.py), as it is.
    add_frontend_flags(sub.add_parser(OPENAI_FRONTEND, help="run the group as Triton's OpenAI-compatible "
                                      "frontend does, from its main.py's flags (deploy/openai_frontend.py)"))

    scale = sub.add_parser("scale", help="change how many workers or ingress processes a running 'serve' runs")
    scale.add_argument("role", nargs="?", choices=ROLES, default=None, help="what to scale (omit: show the counts)")
    scale.add_argument("count", nargs="?", type=int, help="how many to run (omit: show the counts)")
    scale.add_argument("--group", default="default", help="the group of the 'conveyor serve' to scale")
    return parser


def _scale(args: argparse.Namespace) -> int:
    from conveyor.deploy.scale import request_scale

    try:
        counts = request_scale(args.group, args.role or "", args.count)
    except ConveyorError as exc:
        print(f"conveyor scale: {exc.message}", file=sys.stderr)
        return 1
    print(" ".join(f"{role}={n}" for role, n in counts.items()))
    return 0


def _apply_instance(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Turn a systemd instance name into the options and environment it stands for."""
    try:
        if args.command == "worker" and args.instance:
            os.environ.update(worker_environment(args.instance))
        elif args.command == "ingress" and args.instance:
            args.protocol = args.protocol or ingress_protocol(args.instance)
    except ConveyorError as exc:
        parser.error(exc.message)
    if args.command == "ingress" and not args.protocol:
        parser.error("ingress needs --protocol or --instance")


def _check_metrics(parser: argparse.ArgumentParser, settings: Metrics) -> None:
    try:
        parse_quantiles(metrics_config(settings).get("summary_quantiles", "0.5:0.05"))
    except ValueError as exc:
        parser.error(f"--metrics-config: {exc}")


def _check_trace(parser: argparse.ArgumentParser, settings: Tracing) -> None:
    try:
        trace = parse_trace_config(settings.trace_config)
    except (ValueError, ConveyorError) as exc:
        parser.error(f"--trace-config: {exc}")
    if trace.opentelemetry:
        from conveyor.router.observability.otlp_export import otel_missing

        if otel_missing():
            parser.error(otel_missing())


def _check_serve(parser: argparse.ArgumentParser, settings: ServeSettings) -> None:
    _check_metrics(parser, settings)
    _check_trace(parser, settings)
    problem = check_ingress_args(settings) or check_cloud_args(settings)
    if problem:
        parser.error(problem)


def _fold_triton_aliases(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Triton's deprecated and alias flags, as the flags they stand for."""
    if hasattr(args, "http_max_input_size"):  # serve and ingress
        problem = fold_http_max_input_size(args)
        if problem:
            parser.error(problem)
    if args.command in ("serve", "router"):
        fold_deprecated_trace(args)
        problem = fold_response_cache_size(args)
        if problem:
            parser.error(problem)
        if args.disable_auto_complete_config:
            args.strict_model_config = True


def _serve(args: ServeSettings, command_line: bool, notes: list[str] | None = None) -> int:
    from conveyor.deploy.supervisor import Supervisor
    from conveyor.router.repository.backend_config import BackendConfig

    setup_logging(log_settings(args), "serve")
    log_unused(args, [*(notes or []), *BackendConfig.parse(args.backend_config).unused_settings()])
    open_on_grpc = grpc_left_open(args) if args.allow_grpc else []
    if open_on_grpc:
        log.warning("%s restricted over HTTP but not over gRPC: gRPC clients reach them without a header "
                    "(as in Triton, gRPC follows --grpc-restricted-protocol only)", ", ".join(open_on_grpc))
    code = Supervisor(args).run()
    if command_line:  # every child is gone: nothing for the interpreter's teardown to wait for
        exit_now(code)
    return code


def build_tritonserver_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tritonserver", description=tritonserver_main.__doc__)
    # Triton's defaults where they differ (Setting.triton_default): a failed model stops the start,
    # readiness needs every model, clients may register shared memory (Triton 2.5x has no switch
    # for it), and SIGTERM stops at once (no readiness grace; in-flight requests still get
    # --exit-timeout-secs). Model Analyzer SIGKILLs a tritonserver that has not stopped 5 s after its SIGTERM.
    build_options(parser, SERVE, triton=True)
    parser.set_defaults(command="serve")
    return parser


def tritonserver_main(argv: list[str] | None = None) -> int:
    """``tritonserver``: Triton's command line, as it is, running the same group as
    ``conveyor serve`` with Triton's defaults where Conveyor's differ."""
    return run_tritonserver(build_tritonserver_parser(), argv, [], argv is None)


def strict_config_warnings(words: list[str], strict: bool, disable_auto_complete: bool) -> list[str]:
    """Triton's command line's warnings (command_line_parser.cc) for its deprecated --strict-model-config, given as
    ``words`` (``getopt_values``' form), and for one that --disable-auto-complete-config overrides."""
    given = [w for w in words if w == "--strict-model-config" or w.startswith("--strict-model-config=")]
    out = ["Warning: '--strict-model-config' has been deprecated! Please use '--disable-auto-complete-config' "
           "instead."] * len(given)
    if given and disable_auto_complete and not strict:
        out.append("Warning: Overriding deprecated '--strict-model-config' from False to True in favor of "
                   "'--disable-auto-complete-config'!")
    return out


def getopt_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with each value that starts with '-' joined to its flag (``--flag -1:0.6`` as ``--flag=-1:0.6``):
    Triton's getopt_long takes the word after a flag that needs a value as that value, whatever it starts
    with, where argparse would take it for a flag."""
    takes_value = {flag for action in parser._actions if action.nargs is None and action.option_strings
                   for flag in action.option_strings}
    out: list[str] = []
    words = iter(argv)
    for word in words:
        if word in takes_value:
            value = next(words, None)
            out.append(word if value is None else f"{word}={value}")
        else:
            out.append(word)
    return out


def run_tritonserver(parser: argparse.ArgumentParser, argv: list[str] | None, notes: list[str],
                     command_line: bool) -> int:
    """Parse ``argv`` with ``tritonserver``'s parser and run the group; ``notes``: lines logged at start with
    the unused flags' (``conveyor openai-frontend``'s flags that change nothing)."""
    words = getopt_values(parser, sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(words)
    for line in strict_config_warnings(words, args.strict_model_config, args.disable_auto_complete_config):
        print(line, file=sys.stderr)
    fold_storage_uri(args)
    if not args.model_repository:
        print("error: creating server: Invalid argument - --model-repository must be specified", file=sys.stderr)
        return 1
    if args.load_model and args.model_control_mode != "explicit":
        parser.error("Use of '--load-model' requires setting '--model-control-mode=explicit' as well.")
    if "*" in args.load_model and len(args.load_model) > 1:
        print(triton_line("creating server", invalid_arg(WILDCARD_ALONE)), file=sys.stderr)
        return 1
    _fold_triton_aliases(parser, args)
    settings = ServeSettings.of(args)
    _check_serve(parser, settings)
    problem = gpu_limit_problem(settings.unused_model_load_gpu_limit)
    if problem:  # as Triton's main: "Failed to build Triton option:", its error, exit 1
        print(f"Failed to build Triton option:\n{problem}", file=sys.stderr)
        return 1
    os.environ[TRITON_CLI_ENV] = "1"  # the group follows Triton where the commands differ (proto/triton_cli.py)
    return _serve(settings, command_line, notes)


def _ingress(args: argparse.Namespace) -> None:
    """Run one ingress process (blocking): the server its ``--protocol`` names, with that kind's settings."""
    from conveyor.ingress.server_metadata import set_server_name
    from conveyor.proto.errors import client_mistakes_as_400

    answers = Answers.of(args)
    set_server_name(answers.server_id)
    client_mistakes_as_400(answers.client_mistakes_as_400)
    router = args.router or default_endpoints(args.group or DEFAULT_GROUP)[0]
    if args.protocol == "metrics":
        _metrics_ingress(MetricsIngressSettings.of(args), router)
    elif args.protocol in ("sagemaker", "vertex"):
        _cloud_ingress(CloudIngressSettings.of(args), router)
    elif args.protocol == "openai":
        _openai_ingress(OpenAiIngressSettings.of(args), router)
    elif args.protocol == "http":
        _http_ingress(HttpIngressSettings.of(args), router)
    else:
        _grpc_ingress(GrpcIngressSettings.of(args), router)


def _log_level(args: EveryProcess) -> str:
    return "debug" if args.log_verbose > 0 else "warning"


def _metrics_ingress(args: MetricsIngressSettings, router: str) -> None:
    from conveyor.ingress.http.server import serve as serve_http
    from conveyor.ingress.metrics import MetricsOptions, build_metrics_app

    counters = metrics_config(args).get("counter_latencies", "true").lower() in ("1", "true", "yes", "on")
    options = MetricsOptions(args.allow_cpu_metrics, args.allow_gpu_metrics, args.metrics_interval_ms, counters)
    restricted = metrics_rules(args)
    serve_http(router, args.group or DEFAULT_GROUP, args.metrics_address or args.http_address, args.metrics_port,
               arena_bytes=1 << 20, log_level=_log_level(args), exit_timeout_s=args.exit_timeout_secs,
               drain_grace_s=args.drain_grace_secs,
               app_factory=lambda ctx: build_metrics_app(ctx, options, restricted), edge=http_edge(args))


def _cloud_ingress(args: CloudIngressSettings, router: str) -> None:
    from conveyor.ingress.context import IngressContext
    from conveyor.ingress.http.server import serve as serve_http
    from conveyor.ingress.sagemaker.app import build_sagemaker_app
    from conveyor.ingress.vertex.app import HEALTH_ROUTE_ENV, PREDICT_ROUTE_ENV, build_vertex_app

    restricted = http_rules(args)
    body = args.http_max_body_bytes
    if args.protocol == "sagemaker":
        port = args.sagemaker_port

        def cloud_app(ctx: IngressContext) -> Any:
            return build_sagemaker_app(ctx, max_body_bytes=body, restricted=restricted,
                                       model_root=args.sagemaker_model_root)
    else:
        port = args.vertex_ai_port

        def cloud_app(ctx: IngressContext) -> Any:
            return build_vertex_app(ctx, predict_route=os.environ.get(PREDICT_ROUTE_ENV, ""),
                                    health_route=os.environ.get(HEALTH_ROUTE_ENV, ""),
                                    default_model=args.vertex_ai_default_model, max_body_bytes=body,
                                    restricted=restricted, metrics_restricted=metrics_rules(args))
    serve_http(router, args.group or DEFAULT_GROUP, args.http_address, port,
               arena_bytes=args.arena_size, log_level=_log_level(args), exit_timeout_s=args.exit_timeout_secs,
               drain_grace_s=args.drain_grace_secs, max_body_bytes=body, limits=_limits(args),
               app_factory=cloud_app, edge=http_edge(args))


def _openai_ingress(args: OpenAiIngressSettings, router: str) -> None:
    from conveyor.deploy.options import run_dir
    from conveyor.ingress.http.server import serve as serve_http
    from conveyor.ingress.openai.app import OpenAiOptions, build_openai_app
    from conveyor.ingress.openai.errors import body_refusal
    from conveyor.ingress.openai.media import MediaOptions
    from conveyor.ingress.openai.response_store import STORE_FILE, StoreLimits

    media = MediaOptions(args.openai_fetch_remote_media, args.openai_media_fetch_timeout_secs,
                         args.allowed_local_media_path)
    # Every OpenAI ingress process of the group opens the same file: a stored response outlives the process.
    store = args.responses_store or os.path.join(run_dir(args.group or DEFAULT_GROUP), STORE_FILE)
    limits = StoreLimits(args.responses_store_max_count, args.responses_store_max_bytes,
                         args.responses_store_max_age_secs)
    openai = OpenAiOptions(args.lora_separator, args.default_max_tokens, args.http_max_body_bytes,
                           openai_rules(args), args.tool_call_parser, args.tokenizer, tuple(args.api_key),
                           args.openai_error_form, media, store, limits)
    serve_http(router, args.group or DEFAULT_GROUP, args.openai_address or args.http_address, args.openai_port,
               arena_bytes=args.arena_size, log_level=_log_level(args), exit_timeout_s=args.exit_timeout_secs,
               drain_grace_s=args.drain_grace_secs, max_body_bytes=args.http_max_body_bytes, limits=_limits(args),
               app_factory=lambda ctx: build_openai_app(ctx, openai), edge=http_edge(args),
               body_refusal=body_refusal)


def _http_ingress(args: HttpIngressSettings, router: str) -> None:
    from conveyor.ingress.http.server import serve as serve_http

    serve_http(router, args.group or DEFAULT_GROUP, args.http_address, args.http_port,
               arena_bytes=args.arena_size, log_level=_log_level(args), exit_timeout_s=args.exit_timeout_secs,
               drain_grace_s=args.drain_grace_secs, max_body_bytes=args.http_max_body_bytes,
               limits=_limits(args, args.http_header_forward_pattern),
               restricted=http_rules(args),
               ssl_cert=args.http_ssl_cert, ssl_key=args.http_ssl_key, edge=http_edge(args))


def _grpc_ingress(args: GrpcIngressSettings, router: str) -> None:
    from conveyor.ingress.grpc.server import serve as serve_grpc
    from conveyor.ingress.grpc.tls import GrpcTls

    tls = None
    if args.grpc_use_ssl or args.grpc_use_ssl_mutual:
        tls = GrpcTls(args.grpc_server_cert, args.grpc_server_key, args.grpc_root_cert, args.grpc_use_ssl_mutual)
    serve_grpc(router, args.group or DEFAULT_GROUP, args.grpc_address, args.grpc_port,
               arena_bytes=args.arena_size, log_level=_log_level(args), exit_timeout_s=args.exit_timeout_secs,
               drain_grace_s=args.drain_grace_secs,
               limits=_limits(args, args.grpc_header_forward_pattern), tls=tls,
               restricted=restrictions(args.grpc_restricted_protocol, GRPC_HEADER_PREFIX),
               implementation=grpc_server_choice(args), buffer_bytes=args.grpc_max_buffer_bytes,
               connection_buffer_bytes=args.grpc_max_connection_buffer_bytes,
               options=grpc_keepalive_options(args))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "scale":
        return _scale(args)
    if args.command == OPENAI_FRONTEND:
        return frontend_main(args, argv is None)
    _fold_triton_aliases(parser, args)
    _apply_instance(parser, args)
    if args.group is not None and check_name(args.group):
        parser.error(check_name(args.group))
    if args.command == "serve":
        fold_storage_uri(args)
        serve = ServeSettings.of(args)
        _check_serve(parser, serve)
        return _serve(serve, argv is None)  # the supervisor picks the group name when none was given
    args.group = args.group or DEFAULT_GROUP
    if args.command == "router":
        import signal

        from conveyor.proto.triton_cli import CORE_STOP_SIGNAL

        signal.signal(CORE_STOP_SIGNAL, signal.SIG_IGN)  # until the router's loop takes it: never the default's exit
        router = RouterSettings.of(args)
        _check_metrics(parser, router)
        _check_trace(parser, router)
        _start_actor(router, ROUTER)
        return _router(router)
    if args.command == "worker":
        worker = WorkerSettings.of(args)
        _start_actor(worker, WORKER)
        keep_freed_heap()  # the actors that build tensors: megabyte buffers stay warm (deploy/runtime/heap.py)
        return _worker(worker)
    ingress = IngressSettings.of(args)
    _check_metrics(parser, ingress)
    problem = check_ingress_args(ingress)
    if problem:
        parser.error(problem)
    _start_actor(ingress, INGRESS)
    keep_freed_heap()
    try:
        _ingress(args)
    except Exception as exc:
        if not is_bind_failure(exc):
            raise
        # One line, not a traceback: the supervisor stops a group that cannot listen at start-up.
        log.error("error: %s", endpoint(ingress, ingress.protocol).failure(exc))
        exit_now(LISTEN_FAILED_CODE)
    exit_now(0)


def _start_actor(settings: EveryProcess, command: str) -> None:
    """What every actor does first: die with its supervisor, mark what it starts as the group's, log as
    asked, its ZeroMQ I/O thread's policy."""
    die_with_supervisor()  # before anything that a killed supervisor would leave behind
    mark_group_member(settings.group or DEFAULT_GROUP)
    setup_logging(log_settings(settings), command)
    configure_io_threads(settings.io_sched)  # before the first socket starts the I/O thread


def _router(args: RouterSettings) -> int:
    from conveyor.deploy.compose import router_config
    from conveyor.deploy.group_lock import GroupBusy, GroupLock
    from conveyor.deploy.options import run_dir
    from conveyor.router.observability.histograms import configure_summaries
    from conveyor.router.server import Router
    from conveyor.shm.naming import sweep_orphans

    config = router_config(args)
    os.makedirs(run_dir(config.group), exist_ok=True)
    try:
        lock = GroupLock(config.group, "router")  # held until this process exits
    except GroupBusy as exc:
        log.error("%s", exc)
        return GROUP_BUSY_CODE
    sweep_orphans(config.group)
    configure_summaries(metrics_config(args))
    # Pinned once its modules are imported, so that the router and the workers do not import them all on one
    # core (a group's start-up), and before its first socket: the I/O thread inherits the pin.
    pin_dispatch(dispatch_cpu(args.dispatch_cpu))
    router = Router(config)
    router.run()
    lock.release()
    exit_now(router.exit_code)  # each actor leaves once its own cleanup is done (lifeline.py)
    return router.exit_code


def _worker(args: WorkerSettings) -> int:
    from conveyor.deploy.compose import worker_config
    from conveyor.workers.worker import Worker

    pin_dispatch(dispatch_cpu(args.dispatch_cpu))  # as the router's, once imported, before the first socket
    worker = Worker(worker_config(args))
    worker.run()
    exit_now(worker.exit_code)  # ENGINE_DIED_CODE: an engine died, restart (workers/stopping.py)
    return worker.exit_code


if __name__ == "__main__":
    sys.exit(main())
