"""The APIs that take a path, a file name or a file's content from a client, attacked on a real group;
and a full arena's answer, which names none of the server's segments (CVE-2025-23320's class).

One group in explicit model-control mode, its temporary folder (``$TMPDIR``) and SageMaker's model root
its own, a 1 MiB arena per process: SageMaker's multi-model ``url`` (CVE-2026-24208/24209's class), the
repository load API's ``file:`` overrides and the file names a client's ``config`` may carry.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import openai
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import add_sub, identity
from conveyor.deploy.ports import free_ports
from tests.support import openai_models
from tests.support.cloud_http import call
from tests.support.group import Server, _listening, start_server
from tests.support.waiting import eventually

LEVEL = "e2e"

ARENA = 1 << 20  # each process's arena: a request past it is refused
SECRET = "TOP-SECRET-LINE"  # a file beside the repository that no client may read
OVERRIDES = f"conveyor-load-overrides-{os.geteuid()}"  # router/repository/prepare.py OVERRIDES_FOLDER


@dataclass
class Paths:
    server: Server
    tmp: str  # the group's $TMPDIR
    root: str  # --sagemaker-model-root
    secret: str
    sagemaker: int
    openai: int
    log: str


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Paths]:
    base = str(tmp_path_factory.mktemp("paths"))
    repo, tmp, root = (os.path.join(base, d) for d in ("repo", "tmp", "sagemaker-models"))
    os.makedirs(tmp)
    add_sub(repo, "simple", 8)
    identity(repo, "identity_u8", "UINT8")
    openai_models.build(repo, "fake_llm")
    add_sub(os.path.join(root, "abc123"), "model", 0)  # SageMaker unpacks an archive to <root>/<hash>/model
    secret = os.path.join(base, "secret.txt")
    with open(secret, "w") as f:
        f.write(SECRET + "\n")
    sagemaker, openai_port = free_ports(2)
    log = os.path.join(base, "group.log")
    srv = start_server(
        repo, f"paths{os.getpid()}", "--workers", "1", "--model-control-mode", "explicit",
        "--load-model", "simple", "--load-model", "identity_u8", "--load-model", "fake_llm",
        "--allow-sagemaker", "true", "--sagemaker-port", str(sagemaker), "--sagemaker-model-root", root,
        "--openai-port", str(openai_port), "--openai-address", "127.0.0.1",
        "--arena-size", str(ARENA), "--log-file", log, env={**os.environ, "TMPDIR": tmp})
    try:
        eventually(lambda: _listening(sagemaker) and _listening(openai_port), what="the SageMaker and OpenAI ports")
        yield Paths(srv, tmp, root, secret, sagemaker, openai_port, log)
    finally:
        assert srv.stop() == 0
    assert srv.shm_segments() == []


def _everything_under(folder: str) -> set[str]:
    return {os.path.join(d, f) for d, dirs, files in os.walk(folder) for f in files + dirs}


# --- SageMaker's multi-model url ---------------------------------------------------------------

KERNEL_TREES = ["//proc/self", "/proc", "/proc/", "///sys/kernel", "/./proc/self", "/opt/../proc/self",
                "/dev/shm", "//dev//shm/", "/sys/../proc/1/environ"]


def _sagemaker_load(paths: Paths, url: str) -> tuple[int, dict[str, Any]]:
    status, _, body = call(paths.sagemaker, "/models", json.dumps({"model_name": "h", "url": url}).encode())
    return status, json.loads(body) if body else {}


def test_sagemaker_url_never_names_a_kernel_tree(paths: Paths) -> None:
    # Lexical spellings, one that climbs out of the model root, and a link planted under it.
    climbing = f"{paths.root}/abc123/model/" + "../" * 12 + "proc/self"
    linked = os.path.join(paths.root, "linked", "model")
    os.makedirs(os.path.dirname(linked), exist_ok=True)
    os.symlink("/proc/self", linked)
    try:
        for url in [*KERNEL_TREES, climbing, linked]:
            status, doc = _sagemaker_load(paths, url)
            assert status == 400, url
            assert doc == {"error": f'Invalid URL: {url}. "url" property value cannot start with /dev/, '
                                    '/proc/, or /sys/.'}, url
            assert str(paths.server.proc.pid) not in doc["error"]  # never where a link led
    finally:
        os.unlink(linked)
    assert json.loads(call(paths.sagemaker, "/models")[2]) == {"models": []}


def test_sagemaker_url_is_of_tritons_form(paths: Paths) -> None:
    for url in ("/tmp", paths.root, f"{paths.root}/abc123", f"{paths.root}/abc123/other",
                f"{paths.root}/abc123/model/a/b", f"{paths.root}/a b/model", "abc123/model", "s3://bucket/abc/model",
                "gs://bucket/model", f"{paths.root}/abc123/model/../../../repo/simple", ""):
        status, doc = _sagemaker_load(paths, url)
        assert status == 400, url
        if url:
            assert doc["error"] == (f"Invalid \"url\" '{url}': expected a path of the form {paths.root}/<hash>/"
                                    "model[/<subdir>]"), url
    status, doc = _sagemaker_load(paths, f"{paths.root}//abc123/./model/")  # the same folder, spelled loosely
    assert status == 200, doc
    assert call(paths.sagemaker, "/models/h", method="DELETE")[0] == 200


# --- the repository load API's file overrides ------------------------------------------------------

def _simple_config(http: th.InferenceServerClient) -> str:
    config = http.get_model_config("simple")
    return json.dumps(config)


def _onnx(paths: Paths) -> bytes:
    with open(os.path.join(paths.server.repo, "simple", "1", "model.onnx"), "rb") as f:
        return f.read()


ESCAPES = ["file:../escape.txt", "file:1/../../escape.txt", "file:/../escape.txt", "file://../escape.txt",
           "file:1/" + "../" * 12 + "tmp/escape.txt", "file:x/../1/escape.txt", "file:1/escape\0.txt",
           "file:1/" + "e" * 300]


def test_file_overrides_stay_in_their_folder(paths: Paths) -> None:
    http = th.InferenceServerClient(paths.server.http_url)
    config = _simple_config(http)
    watched = (os.path.dirname(paths.server.repo), "/tmp")
    before = {w: _everything_under(w) if w != "/tmp" else set(os.listdir(w)) for w in watched}
    for key in ESCAPES:
        with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
            http.load_model("simple", config=config, files={key: b"payload", "file:1/model.onnx": _onnx(paths)})
    grpc = tg.InferenceServerClient(paths.server.grpc_url)
    with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
        grpc.load_model("simple", config=config, files={"file:../escape.txt": base64.b64encode(b"payload")})
    after = {w: _everything_under(w) if w != "/tmp" else set(os.listdir(w)) for w in watched}
    assert [p for w in watched for p in after[w] - before[w] if "escape" in p] == []
    overrides = os.path.join(paths.tmp, OVERRIDES)
    assert [d for d in os.listdir(overrides) if d.startswith("simple-")] == []  # each refused folder removed
    # The model still serves from its repository, and a proper override loads.
    http.load_model("simple", config=config, files={"file:1/model.onnx": _onnx(paths)})
    assert http.is_model_ready("simple")
    http.load_model("simple")


def test_an_overrides_folder_that_is_not_private_is_not_used(paths: Paths) -> None:
    http = th.InferenceServerClient(paths.server.http_url)
    config = _simple_config(http)
    overrides = os.path.join(paths.tmp, OVERRIDES)
    elsewhere = os.path.join(paths.tmp, "elsewhere")
    os.makedirs(elsewhere)
    shutil.rmtree(overrides, ignore_errors=True)
    try:
        # Another local user's link, or a folder others may write: a load's files could be redirected.
        os.symlink(elsewhere, overrides)
        with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
            http.load_model("simple", config=config, files={"file:1/model.onnx": _onnx(paths)})
        assert os.listdir(elsewhere) == []
        os.unlink(overrides)
        os.mkdir(overrides, 0o700)
        os.chmod(overrides, 0o777)
        with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
            http.load_model("simple", config=config, files={"file:1/model.onnx": _onnx(paths)})
        assert os.listdir(overrides) == []
    finally:
        if os.path.islink(overrides):
            os.unlink(overrides)
        shutil.rmtree(overrides, ignore_errors=True)
    http.load_model("simple", config=config, files={"file:1/model.onnx": _onnx(paths)})  # made afresh, private
    assert os.stat(overrides).st_mode & 0o777 == 0o700
    http.load_model("simple")


# --- file names in a client's config -----------------------------------------------------------------

def _classify(http: th.InferenceServerClient) -> list[str]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [th.InferInput("INPUT0", [1, 16], "INT32").set_data_from_numpy(a),
              th.InferInput("INPUT1", [1, 16], "INT32").set_data_from_numpy(np.ones_like(a))]
    out = http.infer("simple", inputs, outputs=[th.InferRequestedOutput("OUTPUT0", class_count=16)])
    return [v.decode() if isinstance(v, bytes) else str(v) for v in out.as_numpy("OUTPUT0").flatten()]


def test_config_file_names_stay_in_the_model_folder(paths: Paths) -> None:
    http = th.InferenceServerClient(paths.server.http_url)
    base = http.get_model_config("simple")
    # From <repo>/simple, the secret is ../../secret.txt.
    attacks: list[tuple[str, Any]] = [
        ("label_filename", paths.secret), ("label_filename", "../../secret.txt"),
        ("label_filename", "1/../../../secret.txt"), ("default_model_filename", "../../../secret.txt"),
        ("input_data_file", "/dev/zero"), ("input_data_file", "../../../../../dev/zero"),
    ]
    for field, name in attacks:
        config = json.loads(json.dumps(base))
        if field == "label_filename":
            config["output"][0]["label_filename"] = name
        elif field == "default_model_filename":
            config["default_model_filename"] = name
        else:
            config["model_warmup"] = [{"name": "w", "batch_size": 1, "inputs": {
                n: {"data_type": "TYPE_INT32", "dims": [16], "input_data_file": name} for n in ("INPUT0", "INPUT1")}}]
        with pytest.raises(InferenceServerException) as err:
            http.load_model("simple", config=json.dumps(config))
        assert err.value.status() == "400", (field, name)
        assert "must name a file inside the model's directory" in str(err.value.message())
        assert all(SECRET not in label for label in _classify(http)), (field, name)
    assert http.is_model_ready("simple")


# --- a full arena -------------------------------------------------------------------------------------

def test_a_full_arena_names_no_segment(paths: Paths) -> None:
    big = np.zeros(ARENA + 4096, dtype=np.uint8)
    answers: list[str] = []
    http = th.InferenceServerClient(paths.server.http_url)
    for binary in (True, False):  # refused as the body arrives (binary), or when the arena is asked (JSON)
        inp = th.InferInput("INPUT0", list(big.shape), "UINT8").set_data_from_numpy(big, binary_data=binary)
        with pytest.raises(InferenceServerException) as err:
            http.infer("identity_u8", [inp])
        assert err.value.status() == "503"
        answers.append(str(err.value.message()))
    grpc = tg.InferenceServerClient(paths.server.grpc_url)
    with pytest.raises(InferenceServerException) as err:
        grpc.infer("identity_u8", [tg.InferInput("INPUT0", list(big.shape), "UINT8").set_data_from_numpy(big)])
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    answers.append(str(err.value.message()))
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{paths.openai}/v1", api_key="none", max_retries=0, timeout=60)
    with pytest.raises(openai.APIStatusError) as oerr:
        client.completions.create(model="fake_llm", prompt="a " * (ARENA // 2 + 4096), max_tokens=1)
    assert oerr.value.status_code == 503
    answers.append(json.dumps(oerr.value.body))
    for answer in answers:
        assert "the server's arena is full" in answer, answer
        assert "/conveyor." not in answer and "conveyor." not in answer, answer
    # The server's log names the arena instead.
    eventually(lambda: "shared-memory arena '/conveyor." in _read(paths.log), what="the log line naming the arena")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()
