"""TorchScript models served by the real process group, called with tritonclient
over HTTP and gRPC."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.group import Server

LEVEL = "e2e"

pytest.importorskip("torch", reason="torch is not installed (pip install conveyor[torch])")

Client = Any  # httpclient or grpcclient InferenceServerClient


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> Any:
    return httpclient if request.param == "http" else grpcclient


def connect(server: Server, protocol: Any) -> Client:
    return protocol.InferenceServerClient(server.http_url if protocol is httpclient else server.grpc_url)


@pytest.fixture()
def client(server: Server, protocol: Any) -> Client:
    return connect(server, protocol)


def infer_input(protocol: Any, name: str, array: np.ndarray, datatype: str = "FP32") -> Any:
    inp = protocol.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


def test_add_sub_with_index_names(client: Client, protocol: Any) -> None:
    a = np.arange(16, dtype=np.float32)
    b = np.full(16, 0.5, dtype=np.float32)
    result = client.infer("torch_add_sub", [infer_input(protocol, "INPUT__0", a), infer_input(protocol, "INPUT__1", b)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
    config = client.get_model_config("torch_add_sub")
    if not isinstance(config, dict):  # gRPC: a ModelConfigResponse
        config = {"platform": config.config.platform, "backend": config.config.backend}
    assert config["platform"] == "pytorch_libtorch" and config["backend"] == "pytorch"


def test_forward_argument_names(client: Client, protocol: Any) -> None:
    image = np.arange(7, dtype=np.float32)
    result = client.infer("torch_named", [infer_input(protocol, "image", image),
                                          infer_input(protocol, "factor", np.array([-2.0], dtype=np.float32))])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), image * -2)


def test_a_sequence_models_forward_takes_the_control_tensors(client: Client, protocol: Any) -> None:
    # forward(INPUT__0, START__1, READY__2): the config declares one input, the sequence batcher adds the two
    # controls, and they are forward()'s arguments as Triton's libtorch backend counts them.
    got = []
    for i, (start, end) in enumerate(((True, False), (False, True))):
        x = infer_input(protocol, "INPUT__0", np.array([[i + 1]], dtype=np.int32), "INT32")
        result = client.infer("torch_sequence_flags", [x], sequence_id=4242 + (protocol is grpcclient),
                              sequence_start=start, sequence_end=end)
        got.append(int(result.as_numpy("OUTPUT__0").reshape(-1)[0]))
    assert got == [1 + 100 + 10, 2 + 10]


def test_a_sequence_models_state_is_a_returned_value_it_does_not_declare(client: Client, protocol: Any) -> None:
    # forward(INPUT__0, STATE_IN__1) -> (OUTPUT__0, STATE_OUT__1): the state output is the second value.
    got = []
    for i, value in enumerate((5, 7, 1)):
        x = infer_input(protocol, "INPUT__0", np.array([[value]], dtype=np.int32), "INT32")
        result = client.infer("torch_sequence_state", [x], sequence_id=5252 + (protocol is grpcclient),
                              sequence_start=i == 0, sequence_end=i == 2)
        got.append(int(result.as_numpy("OUTPUT__0").reshape(-1)[0]))
    assert got == [5, 12, 13]


def test_strings_as_list_of_str(client: Client, protocol: Any) -> None:
    words = np.array([b"conveyor", b"torch"], dtype=np.object_)
    result = client.infer("torch_strings", [infer_input(protocol, "INPUT__0", words, "BYTES")])
    assert result.as_numpy("OUTPUT__0").tolist() == [b"CONVEYOR", b"TORCH"]


def test_batched_concurrent_requests_get_their_own_rows(server: Server, protocol: Any) -> None:
    def one(i: int) -> None:
        client = connect(server, protocol)
        rows = 1 + i % 3
        x = (np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + 100 * i)
        result = client.infer("torch_batched", [infer_input(protocol, "INPUT__0", x)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x * 2)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), x.sum(axis=1, keepdims=True))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(24)))
    stats = connect(server, httpclient).get_inference_statistics("torch_batched")["model_stats"][0]
    assert stats["inference_count"] >= 24


def test_config_without_inputs_is_unavailable_with_the_reason(client: Client) -> None:
    assert not client.is_model_ready("torch_no_inputs")
    with pytest.raises(InferenceServerException, match="must declare its inputs and outputs"):
        client.get_model_metadata("torch_no_inputs")
    assert client.is_model_ready("torch_add_sub")
