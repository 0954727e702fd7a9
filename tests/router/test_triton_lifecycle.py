"""Model lifecycle as Triton's L0_lifecycle QA holds it, through real clients against a running group:
a load succeeds for every version or none, a model whose config fails Triton's poll is never added, a
model whose load failed has no available version, a version a reload dropped is kept as unloaded, and a
server whose repository root cannot be used (--exit-on-error=false) runs neither live nor ready."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import add_sub
from conveyor.deploy.ports import free_ports
from tests.support import python_models
from tests.support.ensemble_models import ADD_SUB, _step, ensemble
from tests.support.group import Server, _listening, abandon, start_server
from tests.support.waiting import eventually

LEVEL = "e2e"

pytestmark = pytest.mark.timeout(180)


def _inputs() -> list[th.InferInput]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [th.InferInput("INPUT0", [1, 16], "INT32"), th.InferInput("INPUT1", [1, 16], "INT32")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return inputs


def _versions(repo: str, name: str, good: tuple[int, ...], broken: tuple[int, ...] = ()) -> None:
    """``name``: add_sub with these versions (a broken one holds no ONNX model), every version loaded."""
    add_sub(repo, name, 8)
    model = Path(repo) / name
    for v in good:
        if v != 1:
            shutil.copytree(model / "1", model / str(v))
    if 1 not in good:
        shutil.rmtree(model / "1")
    for v in broken:
        (model / str(v)).mkdir()
        (model / str(v) / "model.onnx").write_bytes(b"not an onnx model")
    with open(model / "config.pbtxt", "a", encoding="utf-8") as f:
        f.write("version_policy { all { } }\n")


_SECOND_INSTANCE_FAILS = """
class TritonPythonModel:
    def initialize(self, args):
        if args["model_instance_name"].endswith("_1"):
            raise RuntimeError("this instance does not load")

    def execute(self, requests):
        return []
"""


LOG: list[str] = []  # the explicit group's log file


def _sum(repo: str, name: str, composing: str) -> None:
    ensemble(repo, name, ["A", "B"], ["SUM"], [_step(composing, ADD_SUB, {"OUTPUT0": "SUM"})])


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("lifecycle"))
    second = str(tmp_path_factory.mktemp("second"))
    _versions(repo, "half_broken", (1,), (2,))
    _versions(repo, "growing", (1,))
    add_sub(repo, "other_name", 8)
    os.rename(os.path.join(repo, "other_name"), os.path.join(repo, "misnamed"))
    add_sub(repo, "no_version", 8)
    shutil.rmtree(os.path.join(repo, "no_version", "1"))
    for composing, ens in (("at_start", "ens_at_start"), ("implicit", "ens_implicit"), ("named", "ens_named")):
        add_sub(repo, composing, 8)
        _sum(repo, ens, composing)
    add_sub(repo, "twice", 8)
    add_sub(second, "twice", 8)
    _versions(repo, "overridden", (2,), (1,))
    python_models.write_model(repo, "one_instance_fails", _SECOND_INSTANCE_FAILS,
                              'backend: "python"\ninput [{ name: "X" data_type: TYPE_FP32 dims: [1] }]\n'
                              'output [{ name: "Y" data_type: TYPE_FP32 dims: [1] }]\n'
                              'instance_group [{ count: 2 kind: KIND_CPU }]\n')
    # The first repository given twice is one repository (Triton's set of paths): its models are no duplicates.
    LOG[:] = [str(tmp_path_factory.mktemp("log") / "server.log")]
    srv = start_server(repo, f"lc{os.getpid()}", "--model-repository", second, "--model-repository", repo,
                       "--log-file", LOG[0], "--workers", "1",
                       "--grpc-ingress", "0", "--model-control-mode", "explicit", "--load-model", "ens_at_start",
                       grpc=False)
    yield srv
    assert srv.stop() == 0
    # As Triton's as it stops: a line for each version it unloads (L0_lifecycle counts them).
    assert "successfully unloaded 'at_start' version 1" in Path(LOG[0]).read_text()


def test_a_load_succeeds_for_every_version_or_for_none(explicit: Server) -> None:
    http = th.InferenceServerClient(explicit.http_url)
    with pytest.raises(InferenceServerException) as failed:
        http.load_model("half_broken")
    assert failed.value.message().startswith(
        "load failed for model 'half_broken': version 2 is at UNAVAILABLE state: ")
    assert "version 1" not in failed.value.message()
    # Version 1 loaded, then went with the failed load (Triton's load tracker).
    assert not http.is_model_ready("half_broken", "1")
    rows = {r.get("version"): r for r in http.get_model_repository_index() if r["name"] == "half_broken"}
    assert (rows["1"]["state"], rows["1"]["reason"]) == ("UNAVAILABLE", "unloaded")
    with pytest.raises(InferenceServerException,
                       match="Request for unknown model: 'half_broken' has no available versions"):
        http.infer("half_broken", _inputs())


def test_a_load_fails_when_one_instance_fails(explicit: Server) -> None:
    """Triton loads a version's instances all, or fails it: the instance that loaded goes too."""
    http = th.InferenceServerClient(explicit.http_url)
    with pytest.raises(InferenceServerException) as failed:
        http.load_model("one_instance_fails")
    assert failed.value.message().startswith("load failed for model 'one_instance_fails': version 1 is at "
                                             "UNAVAILABLE state: ")
    assert "this instance does not load" in failed.value.message()
    assert not http.is_model_ready("one_instance_fails")


def test_a_config_that_fails_the_poll_adds_no_model(explicit: Server) -> None:
    http = th.InferenceServerClient(explicit.http_url)
    with pytest.raises(InferenceServerException,
                       match="failed to load 'misnamed', failed to poll from model repository"):
        http.load_model("misnamed")
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'misnamed' is not found"):
        http.infer("misnamed", _inputs())
    # Its load failed instead: the model is there, with no version to serve.
    with pytest.raises(InferenceServerException) as failed:
        http.load_model("no_version")
    assert "at least one version must be available under the version policy of model 'no_version'" in str(
        failed.value)
    with pytest.raises(InferenceServerException,
                       match="Request for unknown model: 'no_version' has no available versions"):
        http.infer("no_version", _inputs())
    assert http.is_server_ready()


def test_a_version_a_reload_dropped_is_kept_as_unloaded(explicit: Server) -> None:
    http = th.InferenceServerClient(explicit.http_url)
    http.load_model("growing")
    assert http.is_model_ready("growing", "1")
    model = Path(explicit.repo) / "growing"
    shutil.copytree(model / "1", model / "2")
    shutil.rmtree(model / "1")
    http.load_model("growing")
    assert http.is_model_ready("growing", "2") and not http.is_model_ready("growing", "1")
    with pytest.raises(InferenceServerException,
                       match="Request for unknown model: 'growing' version 1 is not at ready state"):
        http.infer("growing", _inputs(), model_version="1")
    rows = {r.get("version"): r for r in http.get_model_repository_index() if r["name"] == "growing"}
    assert (rows["1"]["state"], rows["1"]["reason"]) == ("UNAVAILABLE", "unloaded")
    assert rows["2"]["state"] == "READY"
    # Triton's log lines for the loads and the unload (its QA counts them).
    eventually(lambda: "successfully unloaded 'growing' version 1" in Path(LOG[0]).read_text(), 30,
               what="the old version's unload logged")
    log = Path(LOG[0]).read_text()
    assert log.count("successfully loaded 'growing'") == 2 and "loading: growing:2" in log


def test_an_ensemble_loads_and_unloads_with_what_it_is_made_of(explicit: Server) -> None:
    """--load-model of an ensemble loads its composing model; unload_dependents unloads the composing models
    it loaded, not one loaded by its own name (Triton's cascading removal)."""
    http = th.InferenceServerClient(explicit.http_url)
    assert http.is_model_ready("ens_at_start") and http.is_model_ready("at_start")
    http.load_model("named")
    for ens in ("ens_implicit", "ens_named"):
        http.load_model(ens)
        http.unload_model(ens, unload_dependents=True)
    eventually(lambda: not http.is_model_ready("implicit"), what="the composing model unloaded")
    assert http.is_model_ready("named")
    http.unload_model("ens_at_start")  # without unload_dependents: what it is made of stays
    assert http.is_model_ready("at_start")


def test_a_name_two_repositories_hold_loads_from_neither(explicit: Server) -> None:
    http = th.InferenceServerClient(explicit.http_url)
    with pytest.raises(InferenceServerException,
                       match="failed to load 'twice', failed to poll from model repository"):
        http.load_model("twice")
    for ready_only in (False, True):  # listed even among the ready ones, as Triton does
        request = urllib.request.Request(f"http://{explicit.http_url}/v2/repository/index",
                                         json.dumps({"ready": ready_only}).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            rows = [r for r in json.loads(answer.read()) if r["name"] == "twice"]
        assert [(r["state"], r["reason"]) for r in rows] == [
            ("UNAVAILABLE", "model appears in two or more repositories")]


def test_a_config_override_stays_until_the_files_change(explicit: Server) -> None:
    http = th.InferenceServerClient(explicit.http_url)
    with pytest.raises(InferenceServerException, match="load failed for model 'overridden'"):
        http.load_model("overridden")  # its version 1 holds no model
    http.load_model("overridden", config=json.dumps({"backend": "onnxruntime",
                                                     "version_policy": {"specific": {"versions": [2]}}}))
    assert http.is_model_ready("overridden", "2")
    http.load_model("overridden")  # unmodified since: kept as loaded, as Triton
    assert http.is_model_ready("overridden", "2")
    with pytest.raises(InferenceServerException,
                       match="failed to load 'overridden', failed to poll from model repository"):
        http.load_model("overridden", files={"file:2/model.onnx": b"no config with it"})
    assert http.is_model_ready("overridden", "2")


def test_a_repository_root_that_cannot_be_used_leaves_the_server_neither_live_nor_ready(tmp_path: Path) -> None:
    """--exit-on-error=false: Triton's SERVER_FAILED_TO_INITIALIZE, its endpoints up (L0_lifecycle's
    test_parse_error_noexit); without it the server does not start (deploy/supervisor.py)."""
    add_sub(str(tmp_path / "ok"), "simple", 8)
    http_port, grpc_port, metrics_port = free_ports(3)
    log = tmp_path / "server.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor.deploy.tritonserver", "--model-repository", str(tmp_path / "ok"),
         "--model-repository", str(tmp_path / "missing"), "--exit-on-error=false", "--group", f"fi{os.getpid()}",
         "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
         "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--log-file", str(log)])
    try:
        eventually(lambda: _listening(http_port) and _listening(grpc_port), 60, what="the endpoints listen")
        http = th.InferenceServerClient(f"127.0.0.1:{http_port}")
        grpc = tg.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        eventually(lambda: not http.is_server_live() and not grpc.is_server_live(), 30, what="not live")
        assert not http.is_server_ready() and not grpc.is_server_ready()
        assert http.get_server_metadata()["name"] == "triton" and grpc.get_server_metadata().name == "triton"
        for call in (lambda: http.get_model_metadata("simple"), lambda: grpc.get_model_config("simple"),
                     lambda: http.get_model_repository_index()):
            with pytest.raises(InferenceServerException, match="Server not ready"):
                call()
        assert f"Internal: failed to stat file {tmp_path / 'missing'}" in log.read_text()
        assert proc.poll() is None
        # Closed before the stop: as Triton's, a stop waits for open HTTP connections up to the exit timeout.
        http.close()
        grpc.close()
    finally:
        abandon(proc)
