"""Model control, end to end: explicit load / unload over HTTP and gRPC, reload
under load without a failed request, a failed reload leaving the old model
serving, config overrides, and poll mode following the repository."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import add_sub, identity
from tests.support.ensemble_models import ADD_SUB, _step, ensemble
from tests.support.group import Server, start_server
from tests.support.waiting import eventually

LEVEL = "e2e"

pytestmark = pytest.mark.timeout(180)


def simple_inputs(mod: type = th) -> list:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]  # type: ignore[attr-defined]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones_like(a))
    return inputs


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("explicit"))
    add_sub(repo, "simple", 8, "dynamic_batching { }")
    identity(repo, "identity_fp32", "FP32", 0, "-1")
    ensemble(repo, "ens_chain", ["A", "B"], ["SUM"], [_step("simple", ADD_SUB, {"OUTPUT0": "SUM"})])
    srv = start_server(repo, f"x{os.getpid()}", "--workers", "1", "--model-control-mode", "explicit",
                       "--load-model", "simple")
    yield srv
    assert srv.stop() == 0
    assert srv.shm_segments() == []


def test_explicit_load_and_unload(explicit: Server) -> None:
    http = th.InferenceServerClient(explicit.http_url)
    grpc = tg.InferenceServerClient(explicit.grpc_url)
    index = {r["name"]: r for r in http.get_model_repository_index()}
    assert index["simple"]["state"] == "READY"
    assert "state" not in index["identity_fp32"] or index["identity_fp32"]["state"] in ("", None)
    assert not http.is_model_ready("identity_fp32")

    http.load_model("identity_fp32")  # returns once the model is ready, as in Triton
    assert http.is_model_ready("identity_fp32")
    x = th.InferInput("INPUT0", [3], "FP32")
    x.set_data_from_numpy(np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(http.infer("identity_fp32", [x]).as_numpy("OUTPUT0"), [1, 2, 3])

    grpc.unload_model("identity_fp32")
    eventually(lambda: not http.is_model_ready("identity_fp32"))
    rows = {m.name: m for m in grpc.get_model_repository_index().models}
    assert (rows["identity_fp32"].state, rows["identity_fp32"].reason) == ("UNAVAILABLE", "unloaded")
    with pytest.raises(InferenceServerException):
        http.infer("identity_fp32", [x])

    grpc.load_model("identity_fp32")
    assert grpc.is_model_ready("identity_fp32")
    with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
        http.load_model("no_such_model")
    assert http.is_server_ready()


def test_reload_under_load_loses_nothing(explicit: Server) -> None:
    """Version 2 appears; a load swaps to it while clients keep sending: zero errors."""
    repo = explicit.repo
    outcomes: list[str] = []
    stop = threading.Event()

    def load() -> None:
        client = th.InferenceServerClient(explicit.http_url)
        while not stop.is_set():
            try:
                result = client.infer("simple", simple_inputs())
                outcomes.append(result.get_response()["model_version"])
            except InferenceServerException as exc:
                outcomes.append(f"error: {exc.message()}")
        client.close()

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        eventually(lambda: len(outcomes) > 20)
        shutil.copytree(os.path.join(repo, "simple", "1"), os.path.join(repo, "simple", "2"))
        th.InferenceServerClient(explicit.http_url).load_model("simple")
        seen = len(outcomes)
        eventually(lambda: len(outcomes) > seen + 20)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    errors = [o for o in outcomes if o.startswith("error")]
    assert errors == []
    assert outcomes[0] == "1" and outcomes[-1] == "2"
    index = {(r["name"], r["version"]): r["state"]
             for r in th.InferenceServerClient(explicit.http_url).get_model_repository_index()}
    assert index[("simple", "2")] == "READY"


def test_failed_reload_keeps_the_loaded_model(explicit: Server) -> None:
    http = th.InferenceServerClient(explicit.http_url)
    before = http.get_model_metadata("simple")["versions"]
    bad = json.dumps({"name": "simple", "platform": "no_such_platform", "max_batch_size": 8})
    with pytest.raises(InferenceServerException, match="failed to load 'simple'"):
        http.load_model("simple", config=bad)
    assert http.is_model_ready("simple")
    assert http.get_model_metadata("simple")["versions"] == before
    http.infer("simple", simple_inputs())


def test_load_with_a_config_override(explicit: Server) -> None:
    http = th.InferenceServerClient(explicit.http_url)
    three = th.InferInput("INPUT0", [3], "FP32")
    three.set_data_from_numpy(np.array([1, 2, 3], np.float32))
    http.load_model("identity_fp32")
    for _ in range(3):  # the ingress keeps this header's template and its checks' verdict
        assert http.infer("identity_fp32", [three]).as_numpy("OUTPUT0").tolist() == [1, 2, 3]
    override = {
        "name": "identity_fp32", "platform": "onnxruntime_onnx", "max_batch_size": 0,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        # The model's output is [-1]: a config's output dims must be the model's (Triton's exact compare).
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    # A bare key, as protobuf's C++ JSON parser (Triton's) reads one (qa/L0_iterative_sequence sends `direct: {}`).
    http.load_model("identity_fp32", config=json.dumps(override).replace('"max_batch_size"', "max_batch_size"))
    assert http.get_model_config("identity_fp32")["input"][0]["dims"] == [4]
    x = th.InferInput("INPUT0", [3], "FP32")
    x.set_data_from_numpy(np.array([1, 2, 3], np.float32))
    with pytest.raises(InferenceServerException, match="unexpected shape"):
        http.infer("identity_fp32", [x])
    with pytest.raises(InferenceServerException, match="unexpected shape"):  # the verdict went with the old model
        http.infer("identity_fp32", [three])


def test_load_is_refused_in_none_mode(server: Server) -> None:
    http = th.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as err:
        http.load_model("simple")
    assert (err.value.status(), err.value.message()) == (  # Triton's words, in every mode but EXPLICIT
        "503", "explicit model load / unload is not allowed if polling is enabled")
    with pytest.raises(InferenceServerException, match="not allowed"):
        tg.InferenceServerClient(server.grpc_url).unload_model("simple")
    assert http.is_model_ready("simple")


def test_poll_mode_follows_the_repository(tmp_path: object) -> None:
    repo = str(tmp_path)
    add_sub(repo, "simple", 8)
    srv = start_server(repo, f"p{os.getpid()}", "--workers", "1", "--grpc-ingress", "0",
                       "--model-control-mode", "poll", "--repository-poll-secs", "0.5", grpc=False)
    try:
        http = th.InferenceServerClient(srv.http_url)
        identity(repo, "identity_fp32", "FP32", 0, "-1")
        eventually(lambda: http.is_model_ready("identity_fp32"))
        shutil.rmtree(os.path.join(repo, "identity_fp32"))
        eventually(lambda: not http.is_model_ready("identity_fp32"))
        assert http.is_model_ready("simple")
    finally:
        assert srv.stop() == 0


def test_load_with_file_overrides(explicit: Server, tmp_path: object) -> None:
    """Triton's `file:<version>/<name>` parameters: the model loads from the files sent."""
    import base64

    staged = os.path.join(str(tmp_path), "staged")
    identity(staged, "from_files", "FP32", 0, "-1")
    with open(os.path.join(staged, "from_files", "1", "model.onnx"), "rb") as f:
        onnx_bytes = f.read()
    config = {
        "name": "identity_fp32", "platform": "onnxruntime_onnx", "max_batch_size": 0,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    http = th.InferenceServerClient(explicit.http_url)
    http.load_model("identity_fp32", config=json.dumps(config), files={"file:7/model.onnx": onnx_bytes})
    assert http.get_model_metadata("identity_fp32")["versions"] == ["7"]  # the version the files named
    x = th.InferInput("INPUT0", [2], "FP32")
    x.set_data_from_numpy(np.array([4, 5], np.float32))
    np.testing.assert_array_equal(http.infer("identity_fp32", [x]).as_numpy("OUTPUT0"), [4, 5])
    with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
        http.load_model("identity_fp32", config=json.dumps(config), files={"file:model.onnx": onnx_bytes})
    with pytest.raises(InferenceServerException, match="failed to load 'identity_fp32', failed to poll"):
        grpc = tg.InferenceServerClient(explicit.grpc_url)
        grpc.load_model("identity_fp32", files={"file:1/model.onnx": base64.b64encode(onnx_bytes)})
    http.load_model("identity_fp32")  # back to the repository's own files
    assert http.get_model_metadata("identity_fp32")["versions"] == ["1"]


def test_unload_dependents(explicit: Server) -> None:
    http = th.InferenceServerClient(explicit.http_url)
    http.load_model("simple")
    http.load_model("ens_chain")
    assert http.is_model_ready("ens_chain")
    http.unload_model("simple", unload_dependents=True)
    eventually(lambda: not http.is_model_ready("ens_chain") and not http.is_model_ready("simple"))
    rows = {r["name"]: r for r in http.get_model_repository_index()}
    assert rows["ens_chain"]["reason"] == "unloaded"
    http.load_model("ens_chain")  # loads its composing model too, as Triton does
    assert http.is_model_ready("simple") and http.is_model_ready("ens_chain")


def test_unloading_a_composing_model_unloads_its_ensembles(explicit: Server) -> None:
    """Triton's dependency graph: an ensemble whose composing model is unloaded is invalid and unloaded too
    (unload_dependents or not), so strict readiness does not wait on it (L0_lifecycle's
    concurrent_model_load_unload)."""
    http = th.InferenceServerClient(explicit.http_url)
    http.load_model("simple")
    http.load_model("ens_chain")
    assert http.is_model_ready("ens_chain")
    http.unload_model("simple")
    eventually(lambda: not http.is_model_ready("ens_chain") and not http.is_model_ready("simple"))
    rows = {r["name"]: r for r in http.get_model_repository_index()}
    assert rows["ens_chain"]["reason"] == "unloaded"
    assert http.is_server_ready()
