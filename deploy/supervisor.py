"""``conveyor serve``: the one-command local supervisor.

Starts the router, the workers and the ingress processes as children, restarts
any that dies, and on SIGTERM/SIGINT stops them in order: ingress first (they
stop accepting and finish what is in flight), then workers and the router.
Shared-memory segments of the group are swept at start and at exit.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from conveyor.deploy.options import model_control_args, run_dir, scheduling_args
from conveyor.shm.naming import group_segments, shm_preflight, sweep_orphans

log = logging.getLogger("conveyor.supervisor")

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)


@dataclass(eq=False)
class Child:
    role: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started: float = field(default=0.0)

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "conveyor.deploy.cli", *self.argv])
        self.started = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Supervisor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._stop = False

    def _common(self) -> list[str]:
        a = self.args
        return ["--group", a.group, "--log-verbose", str(a.log_verbose),
                "--exit-timeout-secs", str(a.exit_timeout_secs)]

    def _children(self, repos: list[str]) -> tuple[list[Child], list[Child], list[Child]]:
        a = self.args
        common = self._common()
        repo_args = [x for r in repos for x in ("--model-repository", r)]
        shm = ["--allow-client-shm", "true"] if a.allow_client_shm else []
        router = [Child("router", ["router", *common, *repo_args, *scheduling_args(a), *shm, *model_control_args(a)])]
        workers = [Child(f"worker-{i}", ["worker", *common, "--arena-size", str(a.arena_size)])
                   for i in range(a.workers)]
        net = [
            "--http-port", str(a.http_port), "--grpc-port", str(a.grpc_port),
            "--metrics-port", str(a.metrics_port),
            "--http-address", a.http_address, "--grpc-address", a.grpc_address, "--arena-size", str(a.arena_size),
        ]
        ingress: list[Child] = []
        if a.allow_http:
            ingress += [Child(f"http-{i}", ["ingress", "--protocol", "http", *common, *net])
                        for i in range(a.http_ingress)]
        if a.allow_grpc:
            ingress += [Child(f"grpc-{i}", ["ingress", "--protocol", "grpc", *common, *net])
                        for i in range(a.grpc_ingress)]
        if a.allow_metrics:
            ingress.append(Child("metrics", ["ingress", "--protocol", "metrics", *common, *net]))
        return router, workers, ingress

    def run(self) -> int:
        a = self.args
        repos = list(a.model_repository)
        built: str | None = None
        if not repos:
            from conveyor.deploy.example_repo import build

            built = build(os.path.join(tempfile.gettempdir(), f"conveyor-{a.group}-example-models"))
            repos = [built]
            log.info("no --model-repository given: serving the example repository %s", repos[0])
        os.makedirs(run_dir(a.group), exist_ok=True)
        sweep_orphans(a.group)
        arenas = a.workers + (a.http_ingress if a.allow_http else 0) + (a.grpc_ingress if a.allow_grpc else 0)
        warning = shm_preflight(arenas * a.arena_size)
        if warning:
            log.warning("%s", warning)
        router, workers, ingress = self._children(repos)
        everyone = router + workers + ingress
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for child in everyone:
            child.start()
        log.info("serving: HTTP %s, gRPC %s, %d worker(s)",
                 a.http_port if a.allow_http else "off", a.grpc_port if a.allow_grpc else "off", a.workers)
        while not self._stop:
            time.sleep(0.2)
            for child in everyone:
                if not child.alive() and not self._stop:
                    self._restart(child)
        self._shutdown(ingress, router + workers)
        # What this run made in /tmp goes with it: the IPC folder, the example models.
        for path in (run_dir(a.group), built):
            if path:
                shutil.rmtree(path, ignore_errors=True)
        return 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        log.info("received %s: shutting down", signal.Signals(signum).name)
        self._stop = True

    def _restart(self, child: Child) -> None:
        assert child.proc is not None
        code = child.proc.returncode
        delay = RESTART_BACKOFF_S[min(child.restarts, len(RESTART_BACKOFF_S) - 1)]
        if time.monotonic() - child.started > 60:
            child.restarts = 0
        log.error("%s exited with code %s: restarting in %.1fs", child.role, code, delay)
        time.sleep(delay)
        sweep_orphans(self.args.group)
        child.restarts += 1
        child.start()

    def _shutdown(self, first: list[Child], then: list[Child]) -> None:
        timeout = self.args.exit_timeout_secs
        for wave in (first, then):
            for child in wave:
                if child.alive():
                    assert child.proc is not None
                    child.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout + 5
            for child in wave:
                if child.proc is None:
                    continue
                try:
                    child.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.error("%s did not stop in time: killing it", child.role)
                    child.proc.kill()
                    child.proc.wait()
        sweep_orphans(self.args.group)
        left = group_segments(self.args.group)
        if left:
            log.error("shared-memory segments still present after shutdown: %s", left)
        log.info("stopped")
