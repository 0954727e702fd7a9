"""A vLLM engine that dies while it serves (its engine core process killed, as a CPU that lacks an instruction
the model's kernels use kills it with SIGILL at its first request): the model stops being ready at once
instead of answering 500 ``EngineCore encountered an issue`` for ever, the log says what ended the engine core
process, the worker exits and restarts with the model loaded again, and the stream that was running when the
engine died is sent again once the model is back (docs/LLM.md), its text the uninterrupted run's. Its own
group (the session's vLLM group, tests/support/vllm_group.py, must not lose its engine): the Triton sample's
one engine, no ENABLE_VLLM_HEALTH_CHECK (test_vllm_e2e.py has the health check's course)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.deploy.ports import free_ports
from conveyor.deploy.runtime.procs import children, mapped_shm
from tests.support import tiny_llama
from tests.support.group import Server, abandon, pids_of, wait_ready
from tests.support.waiting import eventually

LEVEL = "e2e"

tiny_llama.require_vllm()

pytestmark = pytest.mark.timeout(600)

MODEL = "vllm_model"
LOAD_TIMEOUT_S = 300.0  # importing vLLM in the worker and its engine core, loading the engine, on 2 busy cores
# How soon a dead engine's model is no longer ready: the engine core's end seen at once, the worker's models
# closed (each vLLM engine gets 1 s to stop, a Python model's finalize up to 5 s), the router's next tick.
NOT_READY_WITHIN_S = 15.0
STREAM_TOKENS = 160  # long enough to be mid-stream when the engine is killed (the prompt and these fit in 256)
GREEDY = {"max_tokens": STREAM_TOKENS, "temperature": 0, "ignore_eos": True}
STREAM_TIMEOUT_S = 400.0  # the stream's own run, and the worker's restart and reload while it waits


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """One worker, one engine of the tiny Llama (Triton's sample config); the group's log kept in a file."""
    tiny = tiny_llama.build(tmp_path_factory.getbasetemp() / "tiny_llama")  # the session's, as the other vLLM tests
    repo = tmp_path_factory.mktemp("engine_death_repo")
    tiny_llama.write_repository(repo, tiny, MODEL, enable_lora=False)
    log_path = tmp_path_factory.mktemp("engine_death_log") / "group.log"
    group = f"ed{os.getpid()}"
    http_port, grpc_port, metrics_port = free_ports(3)
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([
            sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", str(repo), "--group", group,
            "--workers", "1", "--grpc-ingress", "0", "--http-port", str(http_port), "--grpc-port", str(grpc_port),
            "--metrics-port", str(metrics_port), "--http-address", "127.0.0.1", "--arena-size", str(32 << 20),
            "--exit-timeout-secs", "20", "--drain-grace-secs", "0",
        ], stderr=log_file)
    srv = Server(proc, group, http_port, grpc_port, metrics_port, str(repo))
    try:
        wait_ready(http_port, proc, timeout=LOAD_TIMEOUT_S)
        yield srv, log_path
    except BaseException:
        abandon(proc)
        raise
    assert srv.stop(60) == 0
    assert srv.shm_segments() == [], "shared memory left behind after shutdown"


def _model_ready(srv: Server) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=10)
    try:
        conn.request("GET", f"/v2/models/{MODEL}/ready")
        return conn.getresponse().status == 200
    finally:
        conn.close()


def _stream(srv: Server, prompt: str, on_first: Callable[[], None] | None = None) -> tuple[str, Any]:
    """Triton's generate_stream, greedy: the text shown, and the error it ended with (None: none);
    ``on_first`` called as the first text arrives."""
    body = {"text_input": prompt, "stream": True, "exclude_input_in_output": True,
            "sampling_parameters": json.dumps(GREEDY)}
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=STREAM_TIMEOUT_S)
    try:
        conn.request("POST", f"/v2/models/{MODEL}/generate_stream", body=json.dumps(body))
        r = conn.getresponse()
        assert r.status == 200, r.read()
        text = ""
        for line in r:
            if not line.startswith(b"data: "):
                continue
            doc = json.loads(line[len(b"data: "):])
            if "error" in doc:
                return text, doc["error"]
            text += doc["text_output"]
            if on_first is not None and text:
                on_first()
                on_first = None
        return text, None
    finally:
        conn.close()


def _engine_cores(worker: int) -> list[int]:
    return [pid for pid, argv in children(worker).items() if argv and argv[0].startswith("VLLM::EngineCore")]


def test_a_dead_engine_is_not_ready_says_why_and_its_model_serves_again(server: tuple[Server, Path]) -> None:
    srv, log_path = server
    prompt = " ".join(tiny_llama.LINES[0].split()[:3])  # the start of a line it learnt: it goes on with text
    uninterrupted, error = _stream(srv, prompt)
    assert error is None and uninterrupted
    (worker,) = pids_of(srv, "worker")
    (core,) = _engine_cores(worker)
    segments = mapped_shm({core}, "psm_")  # vLLM's queues to its engine core (160 MiB each)
    assert segments

    killed: list[float] = []

    def kill() -> None:  # mid-stream: on the reader's thread, as the first text arrives
        os.kill(core, signal.SIGKILL)
        killed.append(time.monotonic())

    got: list[tuple[str, Any]] = []
    reader = threading.Thread(target=lambda: got.append(_stream(srv, prompt, kill)), daemon=True)
    reader.start()
    eventually(lambda: killed, 60, what="the stream's first text", interval=0.01)
    # Not ready at once, whatever the readiness mode: no 500 "EngineCore encountered an issue" meanwhile.
    eventually(lambda: not _model_ready(srv), NOT_READY_WITHIN_S, what="the dead engine's model not ready",
               interval=0.05)
    print(f"not ready {time.monotonic() - killed[0]:.2f} s after the engine core was killed")  # shown with -s
    # The worker's death, seen as any worker's: it restarts and the model loads again; the stream, sent again
    # from the tokens it had shown once the model is back, reads on to the uninterrupted run's end.
    reader.join(STREAM_TIMEOUT_S)
    assert got, "the stream did not end"
    text, error = got[0]
    assert error is None, error
    assert text == uninterrupted
    assert _model_ready(srv)
    assert pids_of(srv, "worker") != {worker}
    log = log_path.read_text(errors="replace")
    assert re.search(rf"the vLLM engine of '{MODEL}' died: its engine core process \(pid {core}\) was killed by "
                     r"SIGKILL", log), log[-4000:]
    assert re.search(r"worker-0 exited with code 5: restarting", log), log[-4000:]
    assert "EngineCore encountered an issue" not in log
    # The dead engine's shared memory went with the worker that closed it.
    assert not [name for name in segments if os.path.exists(f"/dev/shm/{name}")]
    again, error = _stream(srv, prompt)
    assert error is None and again == uninterrupted
