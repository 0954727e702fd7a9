"""``conveyor serve`` and ``tritonserver`` start and stop as a service does: what cannot
work stops the start with one line and a non-zero code, leaving nothing running and
nothing in /dev/shm; SIGTERM stops the group in its deadline even when an actor does not
listen; an idle ``tritonserver`` stops at once; the actors die with their supervisor."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conveyor.deploy import listen
from conveyor.deploy.cli import build_parser
from conveyor.deploy.example_repo import add_sub, write_model
from conveyor.deploy.lifeline import SUPERVISOR_PID_ENV
from conveyor.deploy.options import run_dir
from conveyor.deploy.ports import free_ports
from conveyor.deploy.runtime.procs import children
from conveyor.deploy.settings import ServeSettings
from tests.support.group import _listening, abandon, pids_of, start_server, wait_ready
from tests.support.waiting import eventually, running

LEVEL = "e2e"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("start-stop"))
    add_sub(path, "simple", 8)
    return path


def _running(group: str) -> list[int]:
    """Processes of ``group``'s command lines still running."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if group.encode() in argv and running(int(entry)):
            found.append(int(entry))
    return found


def _segments(group: str) -> list[str]:
    return sorted(e for e in os.listdir("/dev/shm") if e.startswith(f"conveyor.{group}."))


def _command(kind: str, repo: str, group: str, ports: list[int], *extra: str) -> list[str]:
    http, grpc, metrics = ports
    head = ([sys.executable, "-m", "conveyor.deploy.tritonserver"] if kind == "tritonserver"
            else [sys.executable, "-m", "conveyor.deploy.cli", "serve"])
    return [*head, f"--model-repository={repo}", "--group", group, f"--http-port={http}", f"--grpc-port={grpc}",
            f"--metrics-port={metrics}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--workers", "1",
            "--arena-size", str(32 << 20), *extra]


def _holder(port: int, patience: float = 0.0) -> socket.socket:
    """Another program's listening socket on ``port`` (SO_REUSEADDR but no SO_REUSEPORT, as most).
    ``patience``: how long to retry while the kernel still tears down a killed process's sockets."""
    deadline = time.monotonic() + patience
    while True:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# --- what cannot work stops the start --------------------------------------------------


def test_the_addresses_checked_are_those_the_group_listens_on() -> None:
    args = build_parser().parse_args(["serve", "--grpc-ingress", "0", "--allow-metrics", "false",
                                      "--openai-port", "9000", "--http-address", "127.0.0.1"])
    assert [(e.service, e.address, e.port) for e in listen.endpoints(ServeSettings.of(args))] == [
        ("HTTP", "127.0.0.1", 8000), ("OpenAI", "127.0.0.1", 9000)]
    port = free_ports(1)[0]
    where = listen.Endpoint("HTTP", "127.0.0.1", port, "--http-port")
    assert listen.check(where) == ""
    with _holder(port):
        assert listen.check(where) == (f"failed to start HTTP service: Unavailable - Socket '127.0.0.1:{port}' "
                                       "already in use (change --http-port or stop what holds it)")
    # A server that shares its port (SO_REUSEPORT, as another Conveyor group) holds it too: the
    # kernel would split the port's connections between the two.
    with socket.socket() as shared:
        shared.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        shared.bind(("127.0.0.1", port))
        shared.listen()
        assert "already in use" in listen.check(where)
    assert listen.is_bind_failure(OSError(98, "Address already in use"))
    assert listen.is_bind_failure(RuntimeError("Failed to bind to address 127.0.0.1:1"))
    assert not listen.is_bind_failure(OSError(2, "No such file or directory"))


@pytest.mark.parametrize("kind", ["serve", "tritonserver"])
def test_a_port_another_program_holds_stops_the_start_with_one_line(repo: str, kind: str) -> None:
    group = f"pb{os.getpid()}{kind[0]}"
    ports = free_ports(3)
    with _holder(ports[1]):
        started = time.monotonic()
        proc = subprocess.run(_command(kind, repo, group, ports), capture_output=True, text=True, timeout=60)
        took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    # conveyor serve's own lines say ERROR; tritonserver's are Triton's (E<MMDD> ..., the message a JSON string).
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line or re.match(r"E\d{4} ", line)]
    wanted = (f"failed to start GRPC service: Unavailable - Socket '127.0.0.1:{ports[1]}' already in use "
              "(change --grpc-port or stop what holds it)")
    assert len(errors) == 1 and errors[0].endswith(wanted if kind == "serve" else f'{wanted}"'), proc.stderr
    assert "Traceback" not in proc.stderr and "serving:" not in proc.stderr
    assert took < 30  # nothing was started: no restarts, no waiting
    assert _running(group) == [] and _segments(group) == []


# A start refused before anything runs takes an interpreter's start-up and the option table: seconds.
REFUSED_START_S = 30


@pytest.mark.parametrize("kind", ["serve", "tritonserver"])
def test_a_missing_repository_stops_the_start_with_tritons_line(kind: str, tmp_path: Path) -> None:
    """Triton 2.51: ``error: creating server: Internal - failed to stat file /nonexistent_repo`` on stderr and exit
    code 1, where a server that stays up with nothing to serve would be a silent outage under systemd."""
    group = f"mr{os.getpid()}{kind[0]}"
    missing = str(tmp_path / "nonexistent_repo")
    started = time.monotonic()
    proc = subprocess.run(_command(kind, missing, group, free_ports(3)), capture_output=True, text=True,
                          timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    assert f"error: creating server: Internal - failed to stat file {missing}" in proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr and "serving:" not in proc.stderr
    assert took < REFUSED_START_S
    assert _running(group) == [] and _segments(group) == [] and not os.path.exists(run_dir(group))


@pytest.mark.parametrize(("case", "line"), [
    ("one of several missing", "Internal - failed to stat file {missing}"),
    ("a file, not a folder", "Invalid argument - repository path is not a valid directory"),
])
def test_every_repository_is_checked_whatever_exit_on_error_says(repo: str, tmp_path: Path, case: str,
                                                                  line: str) -> None:
    # Triton checks each --model-repository (in sorted order) before it creates the server; with
    # --exit-on-error=false Triton stays up, neither live nor ready, serving nothing: Conveyor exits (docs).
    group = f"mx{os.getpid()}{case[0]}"
    missing = str(tmp_path / "gone")
    if case == "a file, not a folder":
        missing = str(tmp_path / "models.tar")
        Path(missing).write_bytes(b"not a repository")
    proc = subprocess.run(_command("serve", repo, group, free_ports(3), f"--model-repository={missing}",
                                   "--exit-on-error=false"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "error: creating server: " + line.format(missing=missing) in proc.stderr.splitlines()
    assert _running(group) == [] and _segments(group) == []


def _read_until(proc: subprocess.Popen[str], text: str, timeout: float = 60.0) -> list[str]:
    """The supervisor's stderr lines up to the first holding ``text`` (read on a thread: a
    line that never comes must not hang the test)."""
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if text in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout), "".join(lines)
    return lines


def test_an_ingress_that_loses_its_port_during_start_up_stops_the_group(repo: str) -> None:
    # The race the check before start cannot close: the port is taken between the check and
    # the ingress's bind (here, as soon as the supervisor has started the HTTP ingress, which
    # binds only once it is set up, a second or more later).
    group = f"pr{os.getpid()}"
    ports = free_ports(3)
    proc = subprocess.Popen(_command("serve", repo, group, ports), stderr=subprocess.PIPE, text=True)
    try:
        _read_until(proc, "scaled http-ingress from 0 to 1")
        with _holder(ports[0]):
            code = proc.wait(60)
            assert proc.stderr is not None
            rest = proc.stderr.read()
    finally:
        abandon(proc)
    assert code == 1, rest
    assert f"failed to start HTTP service: Unavailable - Socket '127.0.0.1:{ports[0]}' already in use" in rest
    assert "http-0 could not listen (above): stopping" in rest
    assert "Traceback" not in rest and "restarting" not in rest
    assert _running(group) == [] and _segments(group) == []


def test_an_ingress_restarted_after_serving_backs_off_while_its_port_is_taken(repo: str) -> None:
    group = f"rb{os.getpid()}"
    server = start_server(repo, group, "--workers", "1")
    try:
        (http,) = pids_of(server, "ingress-http")
        os.kill(http, signal.SIGKILL)
        eventually(lambda: not running(http), 10)
        with _holder(server.http_port, patience=1.0):
            # Restarted with its back-off (0.5 s, 1 s, 2 s, ...), failing each time; the group lives on.
            time.sleep(2)
            assert server.proc.poll() is None
            assert _listening(server.grpc_port)
        wait_ready(server.http_port, server.proc, timeout=30)  # the next restart binds it
    finally:
        assert server.stop() == 0
    assert _running(group) == [] and _segments(group) == []


def test_a_router_of_the_group_left_running_stops_the_start(repo: str) -> None:
    group = f"or{os.getpid()}"
    router = subprocess.Popen([sys.executable, "-m", "conveyor.deploy.cli", "router", "--group", group,
                               "--model-repository", repo], stderr=subprocess.DEVNULL)
    try:
        lock = os.path.join(run_dir(group), "router.lock")
        eventually(lambda: os.path.exists(lock) and open(lock).read().strip() == str(router.pid), 30)
        proc = subprocess.run(_command("tritonserver", repo, group, free_ports(3)), capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2
        assert (f"group '{group}' already has a router on this host (pid {router.pid}) that this command did "
                "not start") in proc.stderr
        assert _running(group) == [router.pid]  # no worker or ingress joined it
    finally:
        router.terminate()
        router.wait(30)
        shutil.rmtree(run_dir(group), ignore_errors=True)  # a supervisor removes it; this router had none


# --- stopping --------------------------------------------------------------------------


def test_an_idle_tritonserver_stops_at_once_and_leaves_nothing(repo: str) -> None:
    # Model Analyzer SIGKILLs tritonserver 5 s after its SIGTERM: an idle one must be gone well before.
    group = f"ts{os.getpid()}"
    ports = free_ports(3)
    proc = subprocess.Popen(_command("tritonserver", repo, group, ports))
    try:
        wait_ready(ports[0], proc, (ports[1], ports[2]))
        actors = list(children(proc.pid))
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        took = time.monotonic() - started
    finally:
        abandon(proc)
    print(f"idle tritonserver stopped in {took:.2f} s")
    assert took < 4.0
    assert not any(running(pid) for pid in actors) and _segments(group) == []


def test_conveyor_serve_keeps_its_grace_only_while_a_client_may_still_send(repo: str) -> None:
    group = f"gr{os.getpid()}"
    server = start_server(repo, group, "--workers", "1", "--drain-grace-secs", "5")
    with socket.create_connection(("127.0.0.1", server.http_port)) as keep_alive:
        # An open HTTP connection (a balancer's) keeps the HTTP ingress's grace: it may send on it.
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        keep_alive.settimeout(30)
        assert keep_alive.recv(1) == b""  # closed by the ingress once its grace is over
        assert time.monotonic() - started >= 4.5
    assert server.proc.wait(30) == 0
    server = start_server(repo, group, "--workers", "1", "--drain-grace-secs", "5")
    started = time.monotonic()
    assert server.stop() == 0  # nothing in flight, no connection: no grace
    assert time.monotonic() - started < 4.0


def test_sigterm_stops_the_group_by_its_deadline_when_an_actor_does_not_listen(repo: str) -> None:
    # A stopped process keeps SIGTERM pending, as a loop too busy to run its handler would.
    group = f"dl{os.getpid()}"
    server = start_server(repo, group, "--workers", "1", "--exit-timeout-secs", "2")
    actors = list(children(server.proc.pid))
    (http,) = pids_of(server, "ingress-http")
    os.kill(http, signal.SIGSTOP)
    started = time.monotonic()
    try:
        code = server.stop(30)
    finally:
        if running(http):
            os.kill(http, signal.SIGKILL)
    took = time.monotonic() - started
    assert code == 1  # Triton's status when its exit timeout expires with work left
    assert 2.0 <= took < 6.0, took  # the exit timeout, then SIGKILL; not a wave's timeout after another
    assert not any(running(pid) for pid in actors)
    assert _segments(group) == []  # the killed ones' arenas swept


# --- the actors die with their supervisor -------------------------------------------------


def test_kill_9_of_the_supervisor_takes_its_actors_and_the_next_start_sweeps_their_memory(repo: str) -> None:
    group = f"k9{os.getpid()}"
    ports = free_ports(3)
    proc = subprocess.Popen(_command("tritonserver", repo, group, ports), stderr=subprocess.DEVNULL)
    try:
        wait_ready(ports[0], proc, (ports[1], ports[2]))
        actors = list(children(proc.pid))
        left = _segments(group)
        assert len(actors) == 5 and len(left) == 4  # router, worker, 3 ingress; arenas: all but the router's
        proc.kill()
        proc.wait()
        eventually(lambda: not any(running(pid) for pid in actors), 10, what="the actors died with the supervisor")
    finally:
        abandon(proc)
    assert _segments(group) == left  # killed: nobody unlinked them...
    server = start_server(repo, group, "--workers", "1")  # ...until the next start's sweep
    try:
        assert not set(left) & set(server.shm_segments())
    finally:
        assert server.stop() == 0
    assert _running(group) == [] and _segments(group) == []


# A model that starts a process of its own, as vLLM starts its engine core: the helper outlives its
# worker unless the supervisor kills it. Each instance writes its helper's pid to a file of the folder.
_HELPER_MODEL = """
import os, subprocess, sys, tempfile
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        folder = os.environ["HELPER_PIDS"]
        with open(os.path.join(folder, str(self.helper.pid)), "w"):
            pass

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "IN")]) for r in requests]
"""


def _helpers(folder: str) -> list[int]:
    return sorted(int(name) for name in os.listdir(folder))


def test_what_a_dead_actor_started_is_killed_by_the_supervisor(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """When its worker dies (the restart kills what it had started), when the group stops, and when a killed
    supervisor's group is started again: no helper process of a model is left running."""
    repo, pids = str(tmp_path / "repo"), str(tmp_path / "pids")
    os.makedirs(pids)
    write_model(repo, "helper", 'backend: "python"\nmax_batch_size: 0\n'
                'input [{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
                'output [{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }]\n', {"model.py": _HELPER_MODEL})
    monkeypatch.setenv("HELPER_PIDS", pids)
    group = f"hp{os.getpid()}"
    server = start_server(repo, group, "--workers", "1")
    try:
        (first,) = _helpers(pids)
        (worker,) = pids_of(server, "worker")
        os.kill(worker, signal.SIGKILL)  # its helper is orphaned...
        eventually(lambda: len(_helpers(pids)) == 2, 60, what="the restarted worker loaded the model again")
        eventually(lambda: not running(first), 10, what="the dead worker's helper was killed")
        (second,) = set(_helpers(pids)) - {first}
        assert running(second)  # ...and the new worker's is left alone
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        eventually(lambda: not pids_of(server, "worker"), 10, what="the actors died with the supervisor")
        assert running(second)  # nothing was there to kill it...
    finally:
        abandon(server.proc)
    server = start_server(repo, group, "--workers", "1")  # ...until the next start of the group
    try:
        eventually(lambda: not running(second), 10, what="the next start killed the helper left running")
        (third,) = set(_helpers(pids)) - {first, second}
    finally:
        assert server.stop() == 0
    eventually(lambda: not running(third), 10, what="the stop killed what the stopped worker had left")


_ORPHAN = """
import os, sys, time
from conveyor.deploy.lifeline import die_with_supervisor
die_with_supervisor()
print("bound", flush=True)
time.sleep(60)
"""

_PARENT = """
import os, subprocess, sys, time
env = {**os.environ, "CONVEYOR_SUPERVISOR_PID": str(os.getpid())}
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=env, stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "bound\\n"
print(child.pid, flush=True)
time.sleep(60)
"""


def test_an_actor_dies_with_its_supervisor_or_exits_if_it_is_gone_already() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _ORPHAN], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert running(child)
        parent.kill()
        parent.wait()
        eventually(lambda: not running(child), 10, what="the child died with its parent")
    finally:
        abandon(parent)
    # Started by a supervisor that died before the child asked to die with it: it exits at once.
    late = subprocess.run([sys.executable, "-c", _ORPHAN], env={**os.environ, SUPERVISOR_PID_ENV: "1"},
                          capture_output=True, text=True, timeout=60)
    assert late.returncode == 1 and "the supervisor (pid 1) that started this process is gone" in late.stderr

