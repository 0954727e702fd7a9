"""``conveyor serve``: the one-command local supervisor.

Starts the router, the workers and the ingress processes as children, restarts
any that dies, changes how many workers/ingress run when ``conveyor scale``
asks (``deploy/scale.py``), and on SIGTERM/SIGINT stops them in order: ingress
first (readiness false for the drain grace, then they refuse new requests and
finish what is in flight), then workers (each hands its work back and leaves),
then the router. Shared-memory segments of the group are swept at start and at
exit.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from conveyor.deploy.cloud_options import cloud_args
from conveyor.deploy.group_lock import GroupBusy, GroupLock, take_group
from conveyor.deploy.openai_options import openai_args
from conveyor.deploy.options import (
    grpc_keepalive_args,
    ingress_args,
    log_args,
    metrics_args,
    model_control_args,
    run_dir,
    scheduling_args,
)
from conveyor.deploy.scale import ROLES, ScaleServer, socket_path
from conveyor.proto.errors import ConveyorError, invalid_arg
from conveyor.router.startup import EXIT_ON_ERROR_CODE
from conveyor.shm.naming import group_segments, shm_preflight, sweep_orphans

log = logging.getLogger("conveyor.supervisor")

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
# systemd's notification variables belong to the supervisor (a unit's main process): a child
# that inherited them would announce readiness for the whole group.
_SYSTEMD_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


@dataclass(eq=False)
class Child:
    role: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started: float = field(default=0.0)

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _SYSTEMD_ONLY}
        self.proc = subprocess.Popen([sys.executable, "-m", "conveyor.deploy.cli", *self.argv], env=env)
        self.started = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)


class Supervisor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._stop = False
        self.router: Child | None = None
        self.metrics: Child | None = None
        self.cloud: list[Child] = []  # the SageMaker and Vertex AI endpoints, one process each
        # The scalable roles ("workers", "http-ingress", "grpc-ingress"), oldest first.
        self.pools: dict[str, list[Child]] = {role: [] for role in ROLES}
        # Scaled down: SIGTERM sent, draining; killed if still there at the deadline.
        self.retiring: list[tuple[Child, float]] = []
        self._serials = {role: itertools.count() for role in ROLES}
        self._exit_code = 0
        self._lock: GroupLock | None = None

    # --- children ----------------------------------------------------------------------

    def _common(self) -> list[str]:
        a = self.args
        spin = ["--spin-us", a.spin_us] if a.spin_us is not None else []
        io_sched = ["--io-sched", a.io_sched] if a.io_sched is not None else []
        dispatch = ["--dispatch-cpu", a.dispatch_cpu] if a.dispatch_cpu is not None else []
        return ["--group", a.group, *log_args(a), *spin, *io_sched, *dispatch,
                "--exit-timeout-secs", str(a.exit_timeout_secs)]

    def _ingress_args(self) -> list[str]:
        a = self.args
        return [
            *self._common(), "--drain-grace-secs", str(a.drain_grace_secs),
            "--http-port", str(a.http_port), "--grpc-port", str(a.grpc_port), "--metrics-port", str(a.metrics_port),
            "--http-address", a.http_address, "--grpc-address", a.grpc_address, "--arena-size", str(a.arena_size),
            "--metrics-address", a.metrics_address, "--id", a.server_id, *grpc_keepalive_args(a),
            *ingress_args(a), *cloud_args(a), *openai_args(a),
        ]

    def _new_child(self, role: str) -> Child:
        n = next(self._serials[role])
        if role == "workers":
            return Child(f"worker-{n}", ["worker", *self._common(), "--arena-size", str(self.args.arena_size)])
        protocol = role.split("-", 1)[0]
        return Child(f"{protocol}-{n}", ["ingress", "--protocol", protocol, *self._ingress_args()])

    def _router_child(self, repos: list[str]) -> Child:
        repo_args = [x for r in repos for x in ("--model-repository", r)]
        shm = ["--allow-client-shm", "true"] if self.args.allow_client_shm else []
        shm += ["--max-client-shm-regions", str(self.args.max_client_shm_regions)]
        trace_args = [x for item in self.args.trace_config for x in ("--trace-config", item)]
        # No grace for the router: it stops after the ingress processes, which carry the grace.
        return Child("router", ["router", *self._common(), "--drain-grace-secs", "0", *repo_args, *shm,
                                *scheduling_args(self.args), *model_control_args(self.args),
                                *[x for value in self.args.cache_config for x in ("--cache-config", value)],
                                *metrics_args(self.args), *trace_args])

    def _supervised(self) -> list[Child]:
        singles = [c for c in (self.router, self.metrics) if c is not None] + self.cloud
        return singles + [c for pool in self.pools.values() for c in pool]

    # --- scaling -----------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        # The OpenAI ingress is off unless --openai-port asks for it: then it is not a role of this group.
        return {role: len(pool) for role, pool in self.pools.items()
                if role != "openai-ingress" or self.args.openai_port}

    def scale(self, role: str, count: int | None) -> dict[str, int]:
        """Run ``count`` processes of ``role``: start new ones, or retire the newest."""
        if not role or count is None or self._stop:
            return self.counts()
        a = self.args
        if ((role == "http-ingress" and not a.allow_http) or (role == "grpc-ingress" and not a.allow_grpc)
                or (role == "openai-ingress" and not a.openai_port)):
            if count == 0:
                return self.counts()  # nothing to run: the start-up call for a protocol that is off
            raise invalid_arg(f"{role} is turned off (--allow-http/--allow-grpc/--openai-port)")
        pool = self.pools[role]
        before = len(pool)
        while len(pool) < count:
            child = self._new_child(role)
            child.start()
            pool.append(child)
        while len(pool) > count:
            self._retire(pool.pop())
        if before != count:
            log.info("scaled %s from %d to %d", role, before, count)
        return self.counts()

    def _stop_deadline(self) -> float:
        a = self.args
        return time.monotonic() + a.drain_grace_secs + a.exit_timeout_secs + 5

    def _retire(self, child: Child) -> None:
        # SIGTERM drains: a worker hands its instances over first, an ingress finishes its requests.
        child.terminate()
        self.retiring.append((child, self._stop_deadline()))

    def _reap_retired(self) -> None:
        now = time.monotonic()
        for entry in list(self.retiring):
            child, kill_at = entry
            if not child.alive():
                self.retiring.remove(entry)
            elif now > kill_at:
                log.error("%s did not drain in time: killing it", child.role)
                assert child.proc is not None
                child.proc.kill()

    # --- the loop ----------------------------------------------------------------------

    def run(self) -> int:
        a = self.args
        try:
            # Held for the life of this process: no other group of this name can start meanwhile.
            self._lock = take_group(a.group)
        except GroupBusy as exc:
            log.error("%s", exc)
            return 2
        if a.group is None and self._lock.group != "default":
            log.warning("group 'default' is already running on this host: this one is '%s' "
                        "(conveyor scale --group %s)", self._lock.group, self._lock.group)
        a.group = self._lock.group
        repos = list(a.model_repository)
        built: str | None = None
        if not repos:
            from conveyor.deploy.example_repo import build

            built = build(os.path.join(tempfile.gettempdir(), f"conveyor-{a.group}-example-models"))
            repos = [built]
            log.info("no --model-repository given: serving the example repository %s", repos[0])
        from conveyor.router.repository.cloud import RepositoryRoots

        try:
            RepositoryRoots(repos)  # refuse a root the router could not serve before starting anything
        except ConveyorError as exc:
            log.error("%s", exc.message)
            return 2
        os.makedirs(run_dir(a.group), exist_ok=True)
        sweep_orphans(a.group)
        arenas = (a.workers + (a.http_ingress if a.allow_http else 0) + (a.grpc_ingress if a.allow_grpc else 0)
                  + (a.openai_ingress if a.openai_port else 0))
        warning = shm_preflight(arenas * a.arena_size)
        if warning:
            log.warning("%s", warning)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.router = self._router_child(repos)
        self.router.start()
        if a.allow_metrics:
            self.metrics = Child("metrics", ["ingress", "--protocol", "metrics", *self._ingress_args(),
                                             *metrics_args(a)])
            self.metrics.start()
        for protocol, allowed in (("sagemaker", a.allow_sagemaker), ("vertex", a.allow_vertex_ai)):
            if allowed:
                self.cloud.append(Child(protocol, ["ingress", "--protocol", protocol, *self._ingress_args()]))
                self.cloud[-1].start()
        self.scale("workers", a.workers)
        self.scale("http-ingress", a.http_ingress if a.allow_http else 0)
        self.scale("grpc-ingress", a.grpc_ingress if a.allow_grpc else 0)
        self.scale("openai-ingress", a.openai_ingress if a.openai_port else 0)
        control = ScaleServer(socket_path(a.group), self.scale)
        log.info("serving: HTTP %s, gRPC %s, OpenAI %s, %d worker(s); scale with 'conveyor scale --group %s'",
                 a.http_port if a.allow_http else "off", a.grpc_port if a.allow_grpc else "off",
                 a.openai_port or "off", a.workers, a.group)
        with selectors.DefaultSelector() as selector:
            selector.register(control, selectors.EVENT_READ)
            while not self._stop:
                if selector.select(0.2):
                    control.serve_pending()
                self._reap_retired()
                for child in self._supervised():
                    if not child.alive() and not self._stop:
                        self._restart(child)
        control.close()
        self._shutdown()
        # What this run made in /tmp goes with it: the IPC folder, the example models.
        for path in (run_dir(a.group), built):
            if path:
                shutil.rmtree(path, ignore_errors=True)
        self._lock.release()
        return self._exit_code

    def _on_signal(self, signum: int, _frame: object) -> None:
        log.info("received %s: shutting down", signal.Signals(signum).name)
        self._stop = True

    def _restart(self, child: Child) -> None:
        assert child.proc is not None
        code = child.proc.returncode
        if child is self.router and code == EXIT_ON_ERROR_CODE:
            # --exit-on-error: a model failed at start-up; a new router would fail the same way.
            log.error("the router stopped: a model failed to load at start-up (--exit-on-error): stopping")
            self._exit_code = 1
            self._stop = True
            return
        delay = RESTART_BACKOFF_S[min(child.restarts, len(RESTART_BACKOFF_S) - 1)]
        if time.monotonic() - child.started > 60:
            child.restarts = 0
        log.error("%s exited with code %s: restarting in %.1fs", child.role, code, delay)
        time.sleep(delay)
        sweep_orphans(self.args.group)
        child.restarts += 1
        child.start()

    def _shutdown(self) -> None:
        """Ingress first (they drain their requests, which need workers and the router),
        then workers (they hand their work back through the router), then the router."""
        ingress = (self.pools["http-ingress"] + self.pools["grpc-ingress"] + self.pools["openai-ingress"]
                   + ([self.metrics] if self.metrics else [])
                   + self.cloud)
        retiring = [child for child, _ in self.retiring]
        waves = [ingress + retiring, self.pools["workers"], [self.router] if self.router else []]
        for wave in waves:
            for child in wave:
                child.terminate()
            deadline = self._stop_deadline()
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
