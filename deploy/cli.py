"""``conveyor``: serve the whole process group, or run one actor (what systemd runs)."""

from __future__ import annotations

import argparse
import logging
import sys

from conveyor.deploy.options import (
    add_client_shm,
    add_common,
    add_model_control,
    add_network,
    add_repository,
    add_scheduling,
    default_endpoints,
)


def _setup_logging(verbose: int, role: str) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose > 0 else logging.INFO,
        format=f"%(asctime)s {role}[%(process)d] %(levelname)s %(name)s: %(message)s",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="conveyor", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run router, ingress and workers in the foreground")
    add_common(serve)
    add_network(serve)
    add_repository(serve, required=False)
    add_scheduling(serve)
    serve.add_argument("--workers", type=int, default=2, help="worker processes")
    serve.add_argument("--http-ingress", type=int, default=1, help="HTTP ingress processes")
    serve.add_argument("--grpc-ingress", type=int, default=1, help="gRPC ingress processes")
    add_client_shm(serve)
    add_model_control(serve)

    router = sub.add_parser("router", help="run the router")
    add_common(router)
    add_repository(router, required=True)
    add_scheduling(router)
    router.add_argument("--ingress-endpoint", default="", help="ZeroMQ endpoint ingress processes connect to")
    router.add_argument("--worker-endpoint", default="", help="ZeroMQ endpoint workers connect to")
    add_client_shm(router)
    add_model_control(router)

    ingress = sub.add_parser("ingress", help="run one ingress process")
    add_common(ingress)
    add_network(ingress)
    ingress.add_argument("--protocol", choices=["http", "grpc", "metrics"], required=True)
    ingress.add_argument("--router", default="", help="the router's ingress endpoint")

    worker = sub.add_parser("worker", help="run one worker process")
    add_common(worker)
    worker.add_argument("--router", default="", help="the router's worker endpoint")
    worker.add_argument("--ingress-endpoint", default="",
                        help="the router's ingress endpoint, for BLS requests from models")
    worker.add_argument("--arena-size", type=int, default=256 << 20)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_verbose, args.command)
    ingress_ep, worker_ep = default_endpoints(args.group)
    if args.command == "serve":
        from conveyor.deploy.supervisor import Supervisor

        return Supervisor(args).run()
    if args.command == "router":
        import os

        from conveyor.deploy.options import run_dir
        from conveyor.router.lifecycle import ControlMode
        from conveyor.router.rate_limiter import RateLimiter, ResourceLimit
        from conveyor.router.server import Router
        from conveyor.shm.naming import sweep_orphans

        os.makedirs(run_dir(args.group), exist_ok=True)
        sweep_orphans(args.group)
        limiter = None
        if args.rate_limit == "execution_count":
            limiter = RateLimiter([ResourceLimit.parse(r) for r in args.rate_limit_resource])
        Router(args.model_repository, args.ingress_endpoint or ingress_ep,
               args.worker_endpoint or worker_ep, queue_cap=args.max_queue_size,
               allow_client_shm=args.allow_client_shm, control_mode=ControlMode(args.model_control_mode),
               load_models=args.load_model, strict_config=args.strict_model_config,
               poll_secs=args.repository_poll_secs, rate_limiter=limiter).run(args.exit_timeout_secs)
        return 0
    if args.command == "worker":
        from conveyor.workers.worker import Worker

        Worker(args.router or worker_ep, args.group, args.arena_size, args.ingress_endpoint or ingress_ep).run()
        return 0
    if args.command == "ingress":
        level = "debug" if args.log_verbose > 0 else "warning"
        if args.protocol == "metrics":
            from conveyor.ingress.http.server import serve as serve_http
            from conveyor.ingress.metrics import build_metrics_app

            serve_http(args.router or ingress_ep, args.group, args.http_address, args.metrics_port,
                       arena_bytes=1 << 20, log_level=level, exit_timeout_s=args.exit_timeout_secs,
                       app_factory=build_metrics_app)
        elif args.protocol == "http":
            from conveyor.ingress.http.server import serve as serve_http

            serve_http(args.router or ingress_ep, args.group, args.http_address, args.http_port,
                       arena_bytes=args.arena_size, log_level=level, exit_timeout_s=args.exit_timeout_secs)
        else:
            from conveyor.ingress.grpc.server import serve as serve_grpc

            serve_grpc(args.router or ingress_ep, args.group, args.grpc_address, args.grpc_port,
                       arena_bytes=args.arena_size, log_level=level, exit_timeout_s=args.exit_timeout_secs)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
