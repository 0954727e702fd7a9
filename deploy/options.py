"""Command-line options, with the flag names and meanings a Triton user already types."""

from __future__ import annotations

import argparse
import os
import tempfile

from conveyor.router.queue_policy import DEFAULT_QUEUE_CAP


def triton_bool(text: str) -> bool:
    """Triton's boolean flags take true/false (also 1/0, yes/no)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def run_dir(group: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"conveyor-{group}")


def default_endpoints(group: str) -> tuple[str, str]:
    """The router's ingress-facing and worker-facing ZeroMQ endpoints (IPC on this host)."""
    d = run_dir(group)
    return f"ipc://{d}/router-ingress.sock", f"ipc://{d}/router-workers.sock"


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group", default="default",
                   help="name of this process group: shared-memory names and IPC paths carry it")
    p.add_argument("--log-verbose", type=int, default=0, help="verbose logging level (Triton's flag)")
    p.add_argument("--exit-timeout-secs", type=float, default=30.0,
                   help="how long shutdown waits for in-flight requests")


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


def add_repository(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--model-repository", "--model-store", action="append", default=[], required=required,
                   dest="model_repository", help="a Triton model repository (repeatable)")


def add_client_shm(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-client-shm", type=triton_bool, default=False, metavar="BOOL",
                   help="let clients register system/CUDA shared-memory regions (off by default, as in Triton: "
                        "a client may name any segment the server's user can open)")


def _resource_limit(text: str) -> str:
    from conveyor.router.rate_limiter import ResourceLimit

    try:
        ResourceLimit.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_scheduling(p: argparse.ArgumentParser) -> None:
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


def model_control_args(a: argparse.Namespace) -> list[str]:
    """The model-control flags, as the supervisor passes them on to the router."""
    out = ["--model-control-mode", a.model_control_mode, "--repository-poll-secs", str(a.repository_poll_secs),
           "--strict-model-config", str(a.strict_model_config).lower()]
    for name in a.load_model:
        out += ["--load-model", name]
    return out
