"""Attacks through a model repository's files, against a real group in explicit mode: a FIFO where a
file belongs (whoever may write into a repository, or name one through SageMaker's ``POST /models``,
can put one there).

A blocking open of a FIFO waits for a writer for ever: a ``config.pbtxt`` FIFO held one of the
router's repository-agent threads, a model, label or warm-up data file FIFO an instance's thread, and
the load call that asked never came back; a ``model.json`` FIFO held the OpenAI ingress's event loop,
and with it every OpenAI client. Each is now refused at once (proto/repository_files.py): the model is
UNAVAILABLE with Triton's words for a file it cannot read, its load is answered with them, and another
model keeps serving. Every FIFO made is removed again.
"""

from __future__ import annotations

import http.client
import json
import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import add_sub, identity, write_model
from conveyor.deploy.ports import free_port
from conveyor.proto.repository_files import MAX_TEXT_BYTES
from tests.support import text_models
from tests.support.fifos import Fifos
from tests.support.group import Server, _listening, start_server

LEVEL = "e2e"

pytestmark = pytest.mark.timeout(300)
# The bound on each call: a load stuck on a FIFO is never answered, a working one in about a second
# even on a loaded machine (an ONNX session is made, or nothing is: the refusal comes first).
CALL_TIMEOUT_S = 30.0
# A group whose router waits on the FIFO at start never gets ready: the FIFO is released (an end of
# file) past this, so the start ends and the test fails on what it finds rather than hanging.
START_RELEASE_S = 90.0
FIFO = "a FIFO, not a regular file"


def unreadable(path: str | Path) -> str:
    """Triton's words for a file it cannot read (its ReadTextFile), the reason ours."""
    return f"failed to open text file for read {path}: {FIFO}"


@pytest.fixture(scope="module")
def fifos() -> Iterator[Fifos]:
    with Fifos() as made:
        yield made
    assert made.left() == []  # every FIFO the tests made is gone
    assert made.waited == 0  # nothing ever waited in a blocking open of one


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, fifos: Fifos) -> Path:
    root = tmp_path_factory.mktemp("fifo_repo")
    add_sub(str(root), "simple", 8, "dynamic_batching { }")
    # A model whose config.pbtxt is a FIFO when the group starts (its model file is fine).
    identity(str(root), "config_fifo_at_start")
    os.unlink(root / "config_fifo_at_start" / "config.pbtxt")
    fifos.make(root / "config_fifo_at_start" / "config.pbtxt")
    # Generative models of the text_input / text_output contract for the OpenAI ingress, the second with a
    # model.json FIFO where a vLLM model keeps its engine arguments (the ingress reads it for any such model).
    for name in (text_models.PLAIN, "text_fifo"):
        config = text_models.CONFIG.format(name=name, batch=4, policy="", parameters="", one="1", many="-1")
        write_model(root, name, config,
                    {"model.py": textwrap.dedent(text_models.MODEL)})
    fifos.make(root / "text_fifo" / "1" / "model.json")
    return root


@pytest.fixture(scope="module")
def openai_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def srv(repo: Path, fifos: Fifos, openai_port: int) -> Iterator[Server]:
    with fifos.releasing(START_RELEASE_S):
        server = start_server(str(repo), f"rf{os.getpid()}", "--workers", "1", "--model-control-mode", "explicit",
                              "--load-model", "*", "--openai-port", str(openai_port), "--openai-address",
                              "127.0.0.1", ready_timeout=START_RELEASE_S + 60)
    try:
        deadline = time.monotonic() + 30
        while not _listening(openai_port):
            assert time.monotonic() < deadline, "the OpenAI ingress did not listen"
            time.sleep(0.1)
        yield server
    finally:
        fifos.release()  # a reverted fix: whatever still waits on a FIFO comes back, so the group can stop
        assert server.stop() == 0


def call_json(srv: Server | int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """(status, the JSON answer) of one HTTP call (to the group's HTTP port, or to ``srv`` when it is a port),
    bounded by CALL_TIMEOUT_S."""
    port = srv if isinstance(srv, int) else srv.http_port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CALL_TIMEOUT_S)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    return r.status, json.loads(data) if data else None


def load(srv: Server, name: str) -> tuple[int, str]:
    """(status, error message or '') of an explicit load over HTTP."""
    status, doc = call_json(srv, "POST", f"/v2/repository/models/{name}/load")
    return status, doc["error"] if status != 200 else ""


def index_row(srv: Server, name: str) -> dict[str, str]:
    status, rows = call_json(srv, "POST", "/v2/repository/index", {})
    assert status == 200, rows
    return next(r for r in rows if r["name"] == name)


def serves(srv: Server) -> None:
    """Another model's ordinary request: answered, and right, within CALL_TIMEOUT_S."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    body = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": a.ravel().tolist()}
                       for n in ("INPUT0", "INPUT1")]}
    status, doc = call_json(srv, "POST", "/v2/models/simple/infer", body)
    assert status == 200, doc
    assert {o["name"]: o["data"] for o in doc["outputs"]}["OUTPUT0"] == (2 * a).ravel().tolist()


def poll_failed(name: str, why: str) -> tuple[int, str]:
    """Triton's answer to the load of a model whose config its poll could not read: 500 and its words, with the
    reason appended (Triton only logs it: ``Poll failed for model directory '<name>': ...``)."""
    return 500, f"failed to load '{name}', failed to poll from model repository: {why}"


def test_a_config_fifo_at_start_leaves_that_model_unloaded(srv: Server, repo: Path) -> None:
    # As Triton's poll: a config it cannot read adds no model, and the FIFO is never opened. The index lists the
    # name UNAVAILABLE with the reason (Triton's shows the name only).
    why = unreadable(repo / "config_fifo_at_start" / "config.pbtxt")
    assert index_row(srv, "config_fifo_at_start") == {
        "name": "config_fifo_at_start", "version": "", "state": "UNAVAILABLE", "reason": why}
    serves(srv)
    # Loaded again explicitly: refused the same way, at once.
    assert load(srv, "config_fifo_at_start") == poll_failed("config_fifo_at_start", why)
    serves(srv)


def test_a_config_fifo_made_later_is_refused_by_its_load(srv: Server, repo: Path, fifos: Fifos) -> None:
    identity(str(repo), "config_fifo_later")
    config = repo / "config_fifo_later" / "config.pbtxt"
    os.unlink(config)
    fifos.make(config)
    status, expected = poll_failed("config_fifo_later", unreadable(config))
    assert load(srv, "config_fifo_later") == (status, expected)
    serves(srv)
    client = tg.InferenceServerClient(srv.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.load_model("config_fifo_later", client_timeout=CALL_TIMEOUT_S)
        assert (str(err.value.status()), err.value.message()) == ("StatusCode.INTERNAL", expected)
    finally:
        client.close()
    row = index_row(srv, "config_fifo_later")
    assert (row["state"], row["reason"]) == ("UNAVAILABLE", unreadable(config))
    serves(srv)


def test_a_config_past_its_bound_is_refused_unread(srv: Server, repo: Path) -> None:
    """A sparse config.pbtxt of 8 GiB (no disk, all memory once read): refused by its size, never read."""
    identity(str(repo), "huge_config")
    config = repo / "huge_config" / "config.pbtxt"
    os.truncate(config, 8 << 30)
    assert load(srv, "huge_config") == poll_failed(
        "huge_config", f"failed to open text file for read {config}: {8 << 30} bytes, more than the "
                       f"{MAX_TEXT_BYTES} a file of its kind may hold")
    serves(srv)


def test_a_model_file_fifo_is_refused(srv: Server, repo: Path, fifos: Fifos) -> None:
    # A full config: the router never reads model.onnx, the worker's ONNX Runtime would have.
    identity(str(repo), "onnx_fifo")
    onnx_file = repo / "onnx_fifo" / "1" / "model.onnx"
    os.unlink(onnx_file)
    fifos.make(onnx_file)
    assert load(srv, "onnx_fifo") == (
        400, f"load failed for model 'onnx_fifo': version 1 is at UNAVAILABLE state: {unreadable(onnx_file)};\n")
    serves(srv)
    # A config to complete from the model file: the router reads the graph, and refuses.
    write_model(repo, "onnx_fifo_completed", 'name: "onnx_fifo_completed"\nbackend: "onnxruntime"\n')
    completed = fifos.make(repo / "onnx_fifo_completed" / "1" / "model.onnx")
    assert load(srv, "onnx_fifo_completed") == (
        400, f"failed to load 'onnx_fifo_completed': model 'onnx_fifo_completed': {unreadable(completed)}")
    # A Python model: the router reads model.py for its auto_complete_config, and refuses.
    write_model(repo, "python_fifo", 'name: "python_fifo"\nbackend: "python"\n'
                'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    model_py = fifos.make(repo / "python_fifo" / "1" / "model.py")
    assert load(srv, "python_fifo") == (
        400, f"failed to load 'python_fifo': model 'python_fifo': {unreadable(model_py)}")
    serves(srv)


def test_label_and_warmup_file_fifos_are_refused(srv: Server, repo: Path, fifos: Fifos) -> None:
    identity(str(repo), "labels_fifo", dims="4", extra='label_filename: "labels.txt"')
    labels = fifos.make(repo / "labels_fifo" / "labels.txt")
    assert load(srv, "labels_fifo") == (
        400, f"load failed for model 'labels_fifo': version 1 is at UNAVAILABLE state: {unreadable(labels)};\n")
    serves(srv)
    identity(str(repo), "warmup_fifo", dims="4")
    with open(repo / "warmup_fifo" / "config.pbtxt", "a", encoding="utf-8") as f:
        f.write('model_warmup [ { name: "sample" batch_size: 1 inputs { key: "INPUT0" value { '
                'data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "raw" } } } ]\n')
    fifos.make(repo / "warmup_fifo" / "warmup" / "raw")
    status, message = load(srv, "warmup_fifo")
    assert status == 400
    assert message.startswith("load failed for model 'warmup_fifo': version 1 is at UNAVAILABLE state: ")
    assert "warmup data file" in message and message.endswith(f": {FIFO};\n"), message
    serves(srv)
    row = index_row(srv, "warmup_fifo")
    assert row["state"] == "UNAVAILABLE" and FIFO in row["reason"], row


def test_a_model_json_fifo_does_not_hold_the_openai_ingress(srv: Server, openai_port: int) -> None:
    status, doc = call_json(openai_port, "POST", "/v1/completions",
                            {"model": "text_fifo", "prompt": "a b c", "max_tokens": 3})
    assert status == 500 and FIFO in doc["error"]["message"], doc
    # The ingress's loop is free: another model of the same kind answers, and so does the refused one again.
    status, doc = call_json(openai_port, "POST", "/v1/completions",
                            {"model": text_models.PLAIN, "prompt": "a b c", "max_tokens": 3})
    assert status == 200 and doc["choices"][0]["text"] == "c b a", doc
    status, doc = call_json(openai_port, "GET", "/v1/models")
    assert status == 200 and text_models.PLAIN in {m["id"] for m in doc["data"]}, doc
    serves(srv)
