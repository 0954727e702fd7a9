"""Two groups on one host never share a name: a second ``conveyor serve`` of a live
group's explicit name fails at once; with no name it takes a free one, and stopping
either leaves the other serving. A group of the same name that is not this host's (another
run folder, another pid namespace: another container, a test run under ``unshare``) never
touches this one's processes or shared memory when it starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from conveyor.deploy.example_repo import add_sub
from conveyor.deploy.group_lock import GroupBusy, GroupLock, check_name, take_group
from conveyor.deploy.ports import free_port
from conveyor.deploy.runtime.group_paths import RUN_DIR_ENV
from conveyor.shm.naming import group_segments
from conveyor.workers.backends.vllm.priority import descendants
from tests.support.group import start_server, wait_ready
from tests.support.waiting import running

LEVEL = "e2e"


def test_lock_names(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.setenv("CONVEYOR_RUN_DIR", str(tmp_path))
    first = take_group(None)
    second = take_group(None)
    assert (first.group, second.group) == ("default", "default-2")
    with pytest.raises(GroupBusy, match="group 'default' is already running on this host"):
        take_group("default")
    first.release()
    again = take_group(None)  # a released name is free again at once
    assert again.group == "default"
    for lock in (second, again):
        lock.release()
    assert check_name("a.b") and check_name("") and not check_name("team-a_1")
    router = GroupLock("default", "router")  # the router's lock is its own: serve's router holds it
    router.release()


def _serve(repo: str, run_dir: str, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    http = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", repo,
         "--http-port", str(http), "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
         "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--workers", "1",
         "--arena-size", str(32 << 20), "--exit-timeout-secs", "10", "--drain-grace-secs", "0", *extra],
        env={**os.environ, "CONVEYOR_RUN_DIR": run_dir}, stderr=subprocess.PIPE,
    )
    return proc, http


def _infer(http: int, model: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
        inputs.append(tensor)
    return client.infer(model, inputs).as_numpy("OUTPUT0")


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.terminate()
    code = proc.wait(30)
    assert proc.stderr is not None
    proc.stderr.close()
    return code


def test_two_default_groups_serve_their_own_models(tmp_path: object) -> None:
    run_dir = str(tmp_path)
    repos = []
    for name in ("a", "b"):
        repo = os.path.join(run_dir, f"repo-{name}")
        add_sub(repo, f"model_{name}", 8)
        repos.append(repo)
    first, http_a = _serve(repos[0], run_dir)
    second = None
    try:
        wait_ready(http_a, first)
        second, http_b = _serve(repos[1], run_dir)
        wait_ready(http_b, second)
        assert sorted(os.listdir(run_dir)) == ["default", "default-2", "repo-a", "repo-b"]
        assert _infer(http_a, "model_a").shape == (1, 16) and _infer(http_b, "model_b").shape == (1, 16)
        client_a = httpclient.InferenceServerClient(f"127.0.0.1:{http_a}")
        assert not client_a.is_model_ready("model_b")  # each router answers its own ingress
        assert _stop(first) == 0
        for _ in range(20):  # the survivor keeps serving: its sockets and segments were not touched
            _infer(http_b, "model_b")
            time.sleep(0.05)
        assert httpclient.InferenceServerClient(f"127.0.0.1:{http_b}").is_server_ready()
        assert os.path.exists(os.path.join(run_dir, "default-2", "router-ingress.sock"))
    finally:
        _stop(first)
        if second is not None:
            assert _stop(second) == 0


def test_an_explicit_name_that_is_live_fails_at_once(tmp_path: object) -> None:
    model_repo = os.path.join(str(tmp_path), "repo")
    add_sub(model_repo, "simple", 8)
    group = f"tc{os.getpid()}"
    server = start_server(model_repo, group, "--workers", "1")
    try:
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", model_repo,
             "--group", group, "--http-port", str(free_port()), "--grpc-port", str(free_port()),
             "--metrics-port", str(free_port())],
            capture_output=True, text=True, timeout=60,
        )
        assert proc.returncode == 2
        assert f"group '{group}' is already running on this host (pid {server.proc.pid})" in proc.stderr
        assert time.monotonic() - started < 20  # at once: nothing was started
        assert httpclient.InferenceServerClient(server.http_url).is_server_ready()
    finally:
        assert server.stop() == 0


def test_a_group_of_the_same_name_elsewhere_leaves_this_one_alone(tmp_path: object) -> None:
    """What a start does to what a killed group of its name left (``kill_orphans``, ``sweep_orphans``), run
    where another group of the same name starts: with another run folder, and in a pid namespace of its own,
    on this /proc and on its own /proc (the segments' owner pids mean nothing there)."""
    model_repo = os.path.join(str(tmp_path), "repo")
    add_sub(model_repo, "simple", 8)
    group = f"ns{os.getpid()}"
    server = start_server(model_repo, group, "--workers", "1")
    try:
        actors = descendants(server.proc.pid)
        segments = group_segments(group)
        assert actors and segments
        start_sweeps = ("from conveyor.deploy.lifeline import kill_orphans; from conveyor.shm.naming import "
                        f"sweep_orphans; kill_orphans({group!r}); sweep_orphans({group!r})")
        elsewhere = {**os.environ, RUN_DIR_ENV: os.path.join(str(tmp_path), "other")}
        subprocess.run([sys.executable, "-c", start_sweeps], env=elsewhere, check=True, timeout=60)
        namespaces = shutil.which("unshare") is not None and subprocess.run(
            ["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=30).returncode == 0
        if namespaces:  # root, or user namespaces allowed: a container, a CI runner may allow neither
            for own_proc in ([], ["--mount-proc"]):
                subprocess.run(["unshare", "--pid", "--fork", *own_proc, sys.executable, "-c", start_sweeps],
                               check=True, timeout=60)
        assert [pid for pid in actors if not running(pid)] == []
        assert group_segments(group) == segments
        assert _infer(server.http_port, "simple").tolist() == [[2] * 16]
        if not namespaces:
            pytest.skip("no pid namespace can be made here (unshare): the other run folder's case passed")
    finally:
        assert server.stop() == 0
