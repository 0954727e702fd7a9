"""TensorFlow SavedModel and GraphDef models served by the real process group, called with
tritonclient over HTTP and gRPC, against what TensorFlow answers here with the same exported model
(tests/support/tensorflow_models.py, built on the fly): FP32 and BYTES tensors batched along
the first dimension, single and dynamically batched requests, a config completed from the
signature, and Triton's reasons for configs that do not fit. One group serves every test."""

from __future__ import annotations

import importlib.util
import os
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support import tensorflow_models as tfm
from tests.support.group import Server, start_server

LEVEL = "e2e"

if importlib.util.find_spec("tensorflow") is None:  # find_spec: the worker imports it, not this process
    pytest.skip("the tensorflow extra is not installed (pip install 'conveyor[tensorflow]')", allow_module_level=True)

SERVED = ["tf_auto", "tf_declared", "tf_graphdef", "tf_other_signature"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("tensorflow"))
    tfm.build(repo)
    # TensorFlow's import takes seconds, more on a busy host: in the worker, and in the router's
    # completion child (tf_auto's), at the same time.
    srv = start_server(repo, f"tf{os.getpid()}", "--workers", "1", ready_timeout=300)
    yield srv
    assert srv.stop() == 0
    assert srv.shm_segments() == [], "shared memory left behind after shutdown"


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> Any:
    return httpclient if request.param == "http" else grpcclient


def connect(server: Server, protocol: Any) -> Any:
    return protocol.InferenceServerClient(server.http_url if protocol is httpclient else server.grpc_url)


def batch(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    words = np.array([f"word{seed}-{i}".encode() + b"\x00z" * i for i in range(rows)], dtype=np.object_)
    return rng.standard_normal((rows, 4)).astype(np.float32), words


def infer(client: Any, protocol: Any, model: str, x: np.ndarray, words: np.ndarray) -> dict[str, np.ndarray]:
    a = protocol.InferInput("x", list(x.shape), "FP32")
    a.set_data_from_numpy(x)
    b = protocol.InferInput("words", [len(words), 1], "BYTES")
    b.set_data_from_numpy(words.reshape(-1, 1))
    result = client.infer(model, [a, b])
    return {name: result.as_numpy(name) for name in ("y", "upper", "lens")}


def check(got: dict[str, np.ndarray], x: np.ndarray, words: np.ndarray) -> None:
    want = tfm.reference(x, words)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
    assert got["upper"].reshape(-1).tolist() == want["upper"].tolist()
    np.testing.assert_array_equal(got["lens"].reshape(-1), want["lens"])
    assert got["lens"].dtype == np.int32 and got["upper"].shape == (len(words), 1)


@pytest.mark.parametrize("model", SERVED)
def test_single_requests_match_tensorflow(server: Server, protocol: Any, model: str) -> None:
    client = connect(server, protocol)
    for rows, seed in ((1, 1), (4, 2)):
        x, words = batch(rows, seed)
        check(infer(client, protocol, model, x, words), x, words)


@pytest.mark.parametrize("model", ["tf_declared", "tf_graphdef"])
def test_dynamically_batched_requests_get_their_own_rows(server: Server, protocol: Any, model: str) -> None:
    clients = threading.local()  # one per thread: a connection per request would cost more than the model

    def one(i: int) -> None:
        if not hasattr(clients, "client"):
            clients.client = connect(server, protocol)
        x, words = batch(1 + i % 3, 50 + i)
        check(infer(clients.client, protocol, model, x, words), x, words)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(24)))
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(model)["model_stats"][0]
    assert stats["inference_count"] >= 24 and stats["execution_count"] < stats["inference_count"]


def test_config_completed_from_the_signature(server: Server) -> None:
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("tf_auto")
    assert config["platform"] == "tensorflow_savedmodel" and config["backend"] == "tensorflow"
    assert config["default_model_filename"] == "model.savedmodel"
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    inputs = {i["name"]: (i["data_type"], i["dims"], i.get("reshape")) for i in config["input"]}
    assert inputs == {"x": ("TYPE_FP32", [4], None), "words": ("TYPE_STRING", [1], {"shape": []})}
    outputs = {o["name"]: (o["data_type"], o["dims"]) for o in config["output"]}
    assert outputs == {"y": ("TYPE_FP32", [3]), "upper": ("TYPE_STRING", [1]), "lens": ("TYPE_INT32", [1])}


@pytest.mark.parametrize("protocol", [httpclient, grpcclient])
def test_init_ops_file_initialises_the_graph_once(server: Server, protocol: Any) -> None:
    x = np.random.default_rng(9).standard_normal((3, 4)).astype(np.float32)
    inp = protocol.InferInput("x", [3, 4], "FP32")
    inp.set_data_from_numpy(x)
    got = connect(server, protocol).infer("tf_graphdef_init", [inp]).as_numpy("y")
    np.testing.assert_allclose(got, x @ tfm.WEIGHTS, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("model", "reason"), [
    ("tf_wrong_type", "unable to load model 'tf_wrong_type', configuration expects datatype TYPE_FP64 for input "
                      "'x', model provides TYPE_FP32"),
    ("tf_missing_signature", "unable to load model 'tf_missing_signature', expected 'predict' signature"),
    ("tf_graphdef_undeclared", "a GraphDef has no signature to complete the config from"),
    ("tf_graphdef_no_init_file", "unable to find init ops file 'init_ops.json' for model 'tf_graphdef_no_init_file'"),
    ("tf_graphdef_unfed", "unable to load model 'tf_graphdef_unfed': the outputs need more than the inputs the "
                          "config declares: placeholders words are not fed"),
])
def test_configs_that_do_not_fit_say_why(server: Server, model: str, reason: str) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert not client.is_model_ready(model)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert reason in index[model]["reason"]


@pytest.mark.parametrize(("content", "reason"), [
    ('{"init_ops": "init"}', "expected {\"init_ops\": [names]}"),
    ("init", "expected {\"init_ops\": [names]}"),
    ('{"init_ops": ["no_such_op"]}', "names an operation the graph does not have"),
])
def test_an_init_ops_file_that_cannot_be_used_says_why(server: Server, tmp_path: Any, content: str,
                                                       reason: str) -> None:
    import tensorflow as tf

    from conveyor.proto.errors import ConveyorError
    from conveyor.proto.model_config import parse_text
    from conveyor.workers.backends.tensorflow.signature import load_graphdef, run_init_ops

    path = os.path.join(tmp_path, "1", "model.graphdef")
    os.makedirs(os.path.dirname(path))
    with open(os.path.join(tfm._exported, tfm.INIT_GRAPHDEF_FILE), "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())
    (tmp_path / "init_ops.json").write_text(content)  # the model's folder: found when the version's has none
    signature = load_graphdef(tf, path, parse_text('name: "m"\n' + tfm.INIT_CONFIG))
    try:
        with pytest.raises(ConveyorError, match=re.escape(reason)):
            run_init_ops(tf, signature, path, "init_ops.json", "m")
    finally:
        signature.session.close()


@pytest.mark.parametrize(("share", "sessions"), [("1", 3), ("2", 2), ("3", 1)])
def test_instances_share_a_session_up_to_max_session_share_count(server: Server, share: str, sessions: int) -> None:
    from conveyor.proto.model_config import parse_text
    from conveyor.workers.backends.tensorflow.backend import TensorFlowBackend

    path = os.path.join(tfm._exported, tfm.SAVED)
    config = parse_text('name: "m"\n' + tfm.DECLARED +
                        f'parameters {{ key: "MAX_SESSION_SHARE_COUNT" value {{ string_value: "{share}" }} }}\n')
    instances = [TensorFlowBackend(path, config, "cpu") for _ in range(3)]
    x, words = batch(2, 5)
    try:
        assert len({id(i.signature.session) for i in instances}) == sessions
        for instance in instances:  # each answers, on its own session or a shared one
            got = instance.execute({"x": x, "words": words}, ["y"])["y"]
            np.testing.assert_allclose(got, tfm.reference(x, words)["y"], rtol=1e-5, atol=1e-6)
    finally:
        first = instances[0].signature.session
        for instance in instances:
            instance.close()
    assert first._closed  # closed once no instance used it
