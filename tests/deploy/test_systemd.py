"""systemd integration: the unit files verify, sd_notify speaks the protocol, and
every actor says READY=1 only once it really serves (and feeds its watchdog)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.deploy.example_repo import add_sub
from conveyor.deploy.logs import JournalFormatter, stderr_is_journal
from conveyor.deploy.ports import free_port
from conveyor.deploy.runtime.sd_notify import Notifier, notify, watchdog_interval
from conveyor.proto.exit_codes import CREATE_FAILED_CODE
from tests.support.group import _listening
from tests.support.paths import ROOT

LEVEL = "e2e"

UNITS = ROOT / "deploy" / "systemd"
INSTALLED_CONVEYOR = "/opt/conveyor/bin/conveyor"


def _receiver(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    return sock


def test_notify_sends_ready_and_watchdog_to_the_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    with _receiver(path) as rx:
        notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())})
        assert notifier.interval == 2.0
        notifier.ready("serving")
        notifier.ready("again")  # READY is sent once
        notifier.beat(now=100.0)
        notifier.beat(now=101.0)  # within half the period: nothing
        notifier.beat(now=102.5)
        notifier.stopping()
        got = [rx.recv(4096).decode() for _ in range(4)]
    assert got == ["READY=1\nSTATUS=serving", "WATCHDOG=1", "WATCHDOG=1", "STOPPING=1"]


def test_notify_reaches_an_abstract_socket() -> None:
    name = f"conveyor-test-{os.getpid()}"
    with _receiver("\0" + name) as rx:
        assert notify("READY=1", {"NOTIFY_SOCKET": "@" + name})
        assert rx.recv(64) == b"READY=1"


def test_notify_outside_systemd_does_nothing() -> None:
    assert not notify("READY=1", {})
    assert watchdog_interval({}) is None
    # The variables were inherited from a parent the watchdog watches, not this process.
    assert watchdog_interval({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}) is None


def test_journal_is_detected_by_the_stream_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open(tmp_path / "stderr", "w") as stream:
        st = os.fstat(stream.fileno())
        monkeypatch.setattr(sys, "stderr", stream)
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert stderr_is_journal()
        # Inherited by a process whose stderr went elsewhere: not the journal.
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino + 1}")
        assert not stderr_is_journal()
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "careful", None, None)
    assert JournalFormatter("%(message)s").format(record) == "<4>careful"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (apt-get install systemd): unit files not verified")
def test_unit_files_verify(tmp_path: Path) -> None:
    # verify insists that ExecStart exists: point it at this environment's entry point, and
    # instantiate the templates the way docs/DEPLOY.md does.
    conveyor = Path(sys.executable).with_name("conveyor")
    assert conveyor.exists()
    names = {"conveyor.target": "conveyor.target", "conveyor-router.service": "conveyor-router.service",
             "conveyor-worker@.service": "conveyor-worker@gpu0.service",
             "conveyor-ingress@.service": "conveyor-ingress@http-0.service"}
    for source, target in names.items():
        text = (UNITS / source).read_text()
        assert source == "conveyor.target" or INSTALLED_CONVEYOR in text
        (tmp_path / target).write_text(text.replace(INSTALLED_CONVEYOR, str(conveyor)))
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(tmp_path / t) for t in names.values())],
        capture_output=True, text=True, timeout=60,
    )
    # Unknown keys and bad values are only warnings: any output is a failure.
    assert result.returncode == 0 and not result.stderr.strip() and not result.stdout.strip(), result.stderr


class Listener:
    """The datagrams one actor sent to its NOTIFY_SOCKET."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = _receiver(path)
        self.sock.settimeout(0.2)
        self.messages: list[str] = []

    def poll(self) -> list[str]:
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                return self.messages

    def saw(self, prefix: str) -> bool:
        return any(msg.startswith(prefix) for msg in self.poll())

    def wait_for(self, prefix: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.saw(prefix):
                return
        raise AssertionError(f"no {prefix!r} on {self.path} within {timeout}s; got {self.messages}")


@pytest.fixture()
def actor_env(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    env = dict(os.environ, CONVEYOR_RUN_DIR=str(tmp_path / "run"))
    yield tmp_path, env


def test_each_actor_says_ready_only_once_serving(actor_env: tuple[Path, dict[str, str]]) -> None:
    tmp_path, env = actor_env
    group = f"sd{os.getpid()}"
    repo = str(tmp_path / "models")
    add_sub(repo, "simple", 0)
    http_port, grpc_port = free_port(), free_port()
    common = ["--group", group, "--exit-timeout-secs", "5"]
    net = ["--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--http-port", str(http_port),
           "--grpc-port", str(grpc_port), "--arena-size", str(8 << 20)]
    argvs = {
        "worker": ["worker", "--instance", "0", *common, "--arena-size", str(8 << 20)],
        "http": ["ingress", "--instance", "http-0", *common, *net],
        "grpc": ["ingress", "--instance", "grpc-1", *common, *net],
        "router": ["router", *common, "--model-repository", repo],
    }
    listeners = {name: Listener(str(tmp_path / f"{name}.notify")) for name in argvs}
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str) -> None:
        child_env = dict(env, NOTIFY_SOCKET=listeners[name].path, WATCHDOG_USEC="2000000")
        procs[name] = subprocess.Popen([sys.executable, "-m", "conveyor.deploy.cli", *argvs[name]], env=child_env)

    try:
        # Without a router nobody is serving yet: no READY from the worker or the ingress.
        for name in ("worker", "http", "grpc"):
            start(name)
        deadline = time.monotonic() + 30
        while not (_listening(http_port) and _listening(grpc_port)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _listening(http_port) and _listening(grpc_port)
        time.sleep(1.0)
        for name in ("worker", "http", "grpc"):
            assert not listeners[name].saw("READY=1"), f"{name} said READY=1 without a router"
        start("router")
        for name in ("router", "worker", "http", "grpc"):
            listeners[name].wait_for("READY=1")
            listeners[name].wait_for("WATCHDOG=1")
        # CONVEYOR_RUN_DIR moved the IPC sockets (RuntimeDirectory= does the same under systemd).
        assert (tmp_path / "run" / group / "router-ingress.sock").exists()
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for name, proc in procs.items():
            assert proc.wait(30) == 0, name
            assert listeners[name].saw("STOPPING=1"), name
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for listener in listeners.values():
            listener.sock.close()
    assert not [e for e in os.listdir("/dev/shm") if e.startswith(f"conveyor.{group}.")]


def test_a_router_whose_repository_is_missing_exits_and_never_says_ready(
        actor_env: tuple[Path, dict[str, str]]) -> None:
    """As a unit of its own (Restart=on-failure): Triton's line on stderr, a failed exit (systemd restarts it
    and alerts), and never READY=1, which would tell systemd the group serves."""
    tmp_path, env = actor_env
    group = f"sm{os.getpid()}"
    missing = str(tmp_path / "nonexistent_repo")
    listener = Listener(str(tmp_path / "router.notify"))
    try:
        proc = subprocess.run([sys.executable, "-m", "conveyor.deploy.cli", "router", "--group", group,
                               "--model-repository", missing],
                              env=dict(env, NOTIFY_SOCKET=listener.path), capture_output=True, text=True, timeout=60)
        assert proc.returncode == CREATE_FAILED_CODE, proc.stderr
        assert f"error: creating server: Internal - failed to stat file {missing}" in proc.stderr.splitlines()
        assert "Traceback" not in proc.stderr
        assert not [msg for msg in listener.poll() if msg.startswith("READY=1")], listener.messages
    finally:
        listener.sock.close()
    assert not [e for e in os.listdir("/dev/shm") if e.startswith(f"conveyor.{group}.")]
