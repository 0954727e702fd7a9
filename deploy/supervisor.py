"""``conveyor serve``: the one-command local supervisor.

Starts the router, the workers and the ingress processes as children, restarts
any that dies, changes how many workers/ingress run when ``conveyor scale``
asks (``deploy/scale.py``), and on SIGTERM/SIGINT stops them in order: ingress
first (readiness false for the drain grace unless idle, then they refuse new
requests and finish what is in flight), then workers (each hands its work back
and leaves), then the router. Each wave goes as soon as the last one is gone;
whatever is still running when the drain grace and ``--exit-timeout-secs`` are
over is killed. Shared-memory segments of the group are swept at start and at
exit.

What cannot work stops the start, with one line and a non-zero exit code, before
anything runs: a port something else holds (``deploy/listen.py``), a router of
this group left running (``deploy/group_lock.py``). Children die with the
supervisor however it dies (``deploy/lifeline.py``).
"""

from __future__ import annotations

import contextlib
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

from conveyor.deploy import listen
from conveyor.deploy.group_lock import GroupBusy, GroupLock, take_group
from conveyor.deploy.lifeline import child_environment, kill_orphans
from conveyor.deploy.options import run_dir
from conveyor.deploy.runtime.wake_pipe import WakePipe
from conveyor.deploy.scale import ROLES, ScaleServer, socket_path
from conveyor.deploy.settings import INGRESS, ROUTER, WORKER, ServeSettings, handoff, handoff_environment
from conveyor.proto.errors import ConveyorError, invalid_arg, triton_line
from conveyor.proto.exit_codes import (
    CREATE_FAILED_CODE,
    GROUP_BUSY_CODE,
    LISTEN_FAILED_CODE,
    START_FAILED_CODE,
    START_REFUSED_CODE,
)
from conveyor.proto.triton_cli import (
    CORE_STOP_SIGNAL,
    RESTART_ENV,
    STOP_DEADLINE_FILE,
    keeps_running_when_unusable,
    stops_listening_at_once,
)
from conveyor.shm.naming import group_segments, shm_preflight, sweep_orphans
from conveyor.workers.stopping import UNLOAD_GRACE_S, UNLOAD_NOW_SIGNAL

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
    # Started with the group: a failure to listen on its first run stops the start.
    initial: bool = False
    group: str = ""  # what it starts carries it (lifeline.kill_orphans)
    secrets: dict[str, str] = field(default_factory=dict)  # settings handed in its environment (API keys)

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _SYSTEMD_ONLY}
        env.update(child_environment(self.group))
        env.update(self.secrets)
        if self.restarts:
            env[RESTART_ENV] = str(self.restarts)  # Triton's start-up checks are not made again (proto/triton_cli.py)
        self.proc = subprocess.Popen([sys.executable, "-m", "conveyor.deploy.cli", *self.argv], env=env)
        self.started = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    def signal(self, signum: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signum)

    def wait_until(self, deadline: float) -> bool:
        """Whether it has exited by ``deadline`` (monotonic)."""
        assert self.proc is not None
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            log.error("%s did not stop in time: killing it", self.role)
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()


class Supervisor:
    def __init__(self, args: ServeSettings) -> None:
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
        self._starting = True  # children made now are the group's first: see Child.initial
        self._stop_requested = 0.0  # CLOCK_MONOTONIC of the SIGTERM/SIGINT
        self.group = args.group or ""  # the group's name, once its lock is taken (run)

    # --- children ----------------------------------------------------------------------

    # Each child is started with the settings its actor uses (deploy/settings.py), as the flags
    # of its own command: what it runs is what 'conveyor router|worker|ingress ...' by hand runs.

    def _ingress_child(self, role: str, protocol: str) -> Child:
        return Child(role, ["ingress", "--protocol", protocol, *handoff(self.args, INGRESS)], initial=self._starting,
                     group=self.group, secrets=handoff_environment(self.args, INGRESS))

    def _new_child(self, role: str) -> Child:
        n = next(self._serials[role])
        if role == "workers":
            return Child(f"worker-{n}", ["worker", *handoff(self.args, WORKER)], initial=self._starting,
                         group=self.group)
        protocol = role.split("-", 1)[0]
        return self._ingress_child(f"{protocol}-{n}", protocol)

    def _router_child(self, repos: list[str]) -> Child:
        # No grace for the router: it stops after the ingress processes, which carry the grace.
        handed = handoff(self.args, ROUTER, {"model_repository": repos, "drain_grace_secs": 0.0})
        return Child("router", ["router", *handed], initial=True, group=self.group)

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
                child.kill()

    # --- the loop ----------------------------------------------------------------------

    def run(self) -> int:
        a = self.args
        refused = self._unusable_repository()
        if refused:
            return refused
        try:
            # Held for the life of this process: no other group of this name can start meanwhile.
            self._lock = take_group(a.group)
        except GroupBusy as exc:
            log.error("%s", exc)
            return GROUP_BUSY_CODE
        if a.group is None and self._lock.group != "default":
            log.warning("group 'default' is already running on this host: this one is '%s' "
                        "(conveyor scale --group %s)", self._lock.group, self._lock.group)
        a.group = self.group = self._lock.group  # handed to every child
        refused = self._cannot_start()
        if refused:
            return refused
        repos = list(a.model_repository)
        built: str | None = None
        if not repos:
            from conveyor.deploy.example_repo import build

            built = build(os.path.join(tempfile.gettempdir(), f"conveyor-{a.group}-example-models"))
            repos = [built]
            log.info("no --model-repository given: serving the example repository %s", repos[0])
        os.makedirs(run_dir(a.group), exist_ok=True)
        # What killed groups left, this one's and any other's whose processes are all gone (a group
        # name is often unique per run: no later start of that name would sweep it).
        sweep_orphans("")
        kill_orphans(a.group)  # what the actors of a killed group of this name started (its lock is ours now)
        arenas = (a.workers + (a.http_ingress if a.allow_http else 0) + (a.grpc_ingress if a.allow_grpc else 0)
                  + (a.openai_ingress if a.openai_port else 0))
        warning = shm_preflight(arenas * a.arena_size)
        if warning:
            log.warning("%s", warning)
        wake = WakePipe(signals=True)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.router = self._router_child(repos)
        self.router.start()
        if a.allow_metrics:
            self.metrics = self._ingress_child("metrics", "metrics")
            self.metrics.start()
        for protocol, allowed in (("sagemaker", a.allow_sagemaker), ("vertex", a.allow_vertex_ai)):
            if allowed:
                self.cloud.append(self._ingress_child(protocol, protocol))
                self.cloud[-1].start()
        self.scale("workers", a.workers)
        self.scale("http-ingress", a.http_ingress if a.allow_http else 0)
        self.scale("grpc-ingress", a.grpc_ingress if a.allow_grpc else 0)
        self.scale("openai-ingress", a.openai_ingress if a.openai_port else 0)
        self._starting = False
        control = ScaleServer(socket_path(a.group), self.scale)
        log.info("serving: HTTP %s, gRPC %s, OpenAI %s, %d worker(s); scale with 'conveyor scale --group %s'",
                 a.http_port if a.allow_http else "off", a.grpc_port if a.allow_grpc else "off",
                 a.openai_port or "off", a.workers, a.group)
        # Triton's lines for the endpoints started (scripts and Triton's QA grep the log for them).
        for allowed, service, address, port in (
                (a.allow_grpc, "GRPCInferenceService", a.grpc_address, a.grpc_port),
                (a.allow_http, "HTTPService", a.http_address, a.http_port),
                (a.allow_sagemaker, "Sagemaker HTTPService", a.http_address, a.sagemaker_port),
                (a.allow_vertex_ai, "Vertex AI HTTPService", a.http_address, a.vertex_ai_port),
                (a.allow_metrics, "Metrics Service", a.metrics_address, a.metrics_port)):
            if allowed:
                log.info("Started %s at %s:%d", service, address, port)
        with selectors.DefaultSelector() as selector:
            selector.register(control, selectors.EVENT_READ)
            selector.register(wake.fd, selectors.EVENT_READ)
            while not self._stop:
                for key, _ in selector.select(0.2):
                    if key.fileobj is control:
                        control.serve_pending()
                    else:
                        wake.clear()
                self._reap_retired()
                for child in self._supervised():
                    if not child.alive() and not self._stop:
                        self._restart(child)
        control.close()
        self._shutdown()
        wake.close()
        # What this run made in /tmp goes with it: the IPC folder, the example models.
        for path in (run_dir(a.group), built):
            if path:
                shutil.rmtree(path, ignore_errors=True)
        self._lock.release()
        return self._exit_code

    def _unusable_repository(self) -> int:
        """A ``--model-repository`` root the group cannot serve, said before anything starts, as the exit
        code (0: none). A scheme Conveyor does not read: 2. A local root Triton would refuse (missing, not a
        folder): Triton's own line on stderr and its exit code 1; but ``tritonserver --exit-on-error=false``
        starts, and its router holds the group in Triton's SERVER_FAILED_TO_INITIALIZE state (never live,
        never ready; it logs the error). Remote roots are the router's to check (it lists them at start-up)."""
        from conveyor.router.repository.cloud import RepositoryRoots, UnusableRepository

        try:
            RepositoryRoots(list(self.args.model_repository)).check(remote=False)
        except UnusableRepository as problem:
            if keeps_running_when_unusable(self.args.exit_on_error):
                return 0
            print(triton_line("creating server", problem), file=sys.stderr, flush=True)
            return START_FAILED_CODE
        except ConveyorError as exc:
            log.error("%s", exc.message)
            return 2
        return 0

    def _cannot_start(self) -> int:
        """Why this group cannot start, logged, as the exit code; 0 when it can."""
        try:
            # A router of this name that outlived its supervisor (one from before deploy/lifeline.py,
            # or started by hand) would refuse ours, and take our workers and ingress processes.
            GroupLock(self.group, "router").release()
        except GroupBusy as exc:
            log.error("%s", exc)
            return GROUP_BUSY_CODE
        problems = listen.check_all(self.args)
        for problem in problems:
            log.error("error: %s", problem)
        return START_FAILED_CODE if problems else 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        log.info("received %s: shutting down", signal.Signals(signum).name)
        if not self._stop:
            self._stop_requested = time.monotonic()
        self._stop = True

    def _fail(self, code: int, why: str) -> None:
        log.error("%s: stopping", why)
        self._exit_code = code
        self._stop_requested = time.monotonic()
        self._stop = True

    def _restart(self, child: Child) -> None:
        assert child.proc is not None
        code = child.proc.returncode
        if child is self.router and code == CREATE_FAILED_CODE:
            # A repository it cannot use, or a model failed with --exit-on-error: a new router would fail the same way.
            self._fail(START_FAILED_CODE, "the router stopped: it could not create the server (above)")
            return
        if child is self.router and code == GROUP_BUSY_CODE:
            self._fail(GROUP_BUSY_CODE, "the router could not take the group's lock (above)")
            return
        if code == START_REFUSED_CODE:
            # An endpoint refused the start as Triton's StartEndpoints does (the Vertex AI default model): Triton exits.
            self._fail(START_FAILED_CODE, f"{child.role} refused to start (above)")
            return
        if code == LISTEN_FAILED_CODE and child.initial and child.restarts == 0:
            # Something took the port between the check in run() and this child's bind: as the
            # check would have, fail the start. A restart (it had served) backs off instead.
            self._fail(START_FAILED_CODE, f"{child.role} could not listen (above)")
            return
        if time.monotonic() - child.started > 60:
            child.restarts = 0  # it had run a good while: back off from the start again
        delay = RESTART_BACKOFF_S[min(child.restarts, len(RESTART_BACKOFF_S) - 1)]
        log.error("%s exited with code %s: restarting in %.1fs", child.role, code, delay)
        time.sleep(delay)
        sweep_orphans(self.group)
        kill_orphans(self.group)  # what the dead child had started
        child.restarts += 1
        child.start()

    def _shutdown(self) -> None:
        """Ingress first (they drain their requests, which need workers and the router),
        then workers (they hand their work back through the router), then the router.

        Each wave gets SIGTERM once the one before it is gone. The group's deadline is the
        drain grace plus the exit timeout after the stop request: workers still there then
        are told to unload their models now and get ``UNLOAD_GRACE_S`` for it (Triton unloads
        after its exit timeout); any other actor past it, and a worker past its grace, is
        killed, and a wave not yet signalled by then is killed outright."""
        a = self.args
        deadline = (self._stop_requested or time.monotonic()) + a.drain_grace_secs + a.exit_timeout_secs
        ingress = (self.pools["http-ingress"] + self.pools["grpc-ingress"] + self.pools["openai-ingress"]
                   + ([self.metrics] if self.metrics else [])
                   + self.cloud)
        retiring = [child for child, _ in self.retiring]
        waves = [ingress + retiring, self.pools["workers"], [self.router] if self.router else []]
        killed: list[str] = []
        unloaded: list[str] = []  # workers told at the deadline to unload with requests open
        for wave in waves:
            live = [child for child in wave if child.proc is not None]
            if wave is self.pools["workers"]:
                if stops_listening_at_once(a.drain_grace_secs):
                    # Triton's core stop begins once its endpoints have stopped (the ingress wave, here).
                    log.info("Waiting for in-flight requests to complete.")
                if self.router is not None:
                    # Before the workers' SIGTERM: the router moves no instance to a worker that leaves too
                    # (and under tritonserver logs Triton's in-flight lines, with the time left).
                    with contextlib.suppress(OSError):
                        with open(os.path.join(run_dir(self.group), STOP_DEADLINE_FILE), "w") as f:
                            f.write(repr(deadline))
                    self.router.signal(CORE_STOP_SIGNAL)
            if wave is self.pools["workers"] and live and not (self.router and self.router.alive()):
                # No router (it stopped first: --exit-on-error, or it died): nothing can take their work
                # back or grant their leave, so they unload now instead of waiting out the exit timeout
                # (30 s by default, where Triton exits at once).
                for child in live:
                    child.signal(UNLOAD_NOW_SIGNAL)
                grace = time.monotonic() + UNLOAD_GRACE_S
                for child in live:
                    if not child.wait_until(grace):
                        child.kill()
                        killed.append(child.role)
                continue
            if time.monotonic() < deadline:
                for child in live:
                    child.terminate()
            late = [child for child in live if not child.wait_until(deadline)]
            if late and wave is self.pools["workers"]:
                # As Triton unloads its models once the exit timeout has run out, the workers
                # unload theirs (a Python model's finalize) before anything is killed.
                for child in late:
                    child.signal(UNLOAD_NOW_SIGNAL)
                grace = time.monotonic() + UNLOAD_GRACE_S
                unloaded += [child.role for child in late]
                late = [child for child in late if not child.wait_until(grace)]
            for child in late:
                child.kill()
                killed.append(child.role)
            for child in live:
                log.debug("%s stopped %.2fs after the stop request", child.role,
                          time.monotonic() - (self._stop_requested or deadline))
        if killed or unloaded:
            # Triton's words and exit status when its exit timeout expires with work left.
            past = [f"killed: {', '.join(killed)}"] if killed else []
            past += [f"unloaded with requests open: {', '.join(unloaded)}"] if unloaded else []
            log.error("failed to stop server: Internal - Exit timeout expired. Exiting immediately. "
                      "(at the deadline, %s)", "; ".join(past))
            self._exit_code = self._exit_code or 1
        sweep_orphans(self.group)
        kill_orphans(self.group, stopping=True)
        left = group_segments(self.group)
        if left:
            log.error("shared-memory segments still present after shutdown: %s", left)
        log.info("stopped")
