"""PyTorch 2 packages (``platform: "torch_aoti"``, ``model.pt2``: torch.export + AOTInductor) served by a
real group: batched through the dynamic batcher, answers equal to the module's own, a shape outside the
exported range refused with the package's reason, a broken package failing its model alone, a sequence
model's implicit state carried from request to request."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import write_model
from tests.support.group import Server, start_server

LEVEL = "e2e"

torch = pytest.importorskip("torch", reason="torch is not installed (pip install conveyor[torch])")

MAX_BATCH = 8  # the batch range the package was exported for: 1..8


@pytest.fixture(scope="module")
def mlp() -> Any:
    from tests.support import torch_models

    torch.manual_seed(7)
    return torch_models.Mlp().eval()


@pytest.fixture(scope="module")
def pt2_server(tmp_path_factory: pytest.TempPathFactory, mlp: Any) -> Iterator[Server]:
    from tests.support import torch_models

    repo = tmp_path_factory.mktemp("pt2")
    package = torch_models.export_pt2(mlp, str(tmp_path_factory.mktemp("build") / "model.pt2"), MAX_BATCH)
    fmt = torch_models.PT2_CONFIG.format
    # Batched, through the dynamic batcher.
    write_model(str(repo), "pt2_mlp", fmt(name="pt2_mlp", max_batch=MAX_BATCH, dims="4", out0="3", out1="1",
                                          extra="dynamic_batching { max_queue_delay_microseconds: 20000 }"))
    # The same package, not batching: the first dimension is the client's, up to what it was exported for.
    write_model(str(repo), "pt2_rows", fmt(name="pt2_rows", max_batch=0, dims="-1, 4", out0="-1, 3",
                                           out1="-1, 1", extra=""))
    # No config at all: found by its file, and told what it lacks.
    os.makedirs(repo / "pt2_bare" / "1")
    write_model(str(repo), "pt2_broken", fmt(name="pt2_broken", max_batch=0, dims="-1, 4", out0="-1, 3",
                                             out1="-1, 1", extra=""))
    for name in ("pt2_mlp", "pt2_rows", "pt2_bare"):
        shutil.copy(package, repo / name / "1" / "model.pt2")
    (repo / "pt2_broken" / "1" / "model.pt2").write_bytes(b"PK\x03\x04 not a package")
    # A sequence model with an implicit state (forward(x, state) -> (total, total)), batched up to 2.
    state = write_model(str(repo), "pt2_sequence_state", torch_models.PT2_STATE_CONFIG)
    torch_models.export_pt2_state(os.path.join(state, "1", "model.pt2"), 2)
    server = start_server(str(repo), f"pt2{os.getpid()}", "--workers", "1")
    yield server
    assert server.stop() == 0


def test_batched_requests_answer_as_the_module_does(pt2_server: Server, mlp: Any) -> None:
    def one(i: int) -> None:
        client = httpclient.InferenceServerClient(pt2_server.http_url)
        x = np.random.default_rng(i).standard_normal((1 + i % 3, 4)).astype(np.float32)
        inp = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("pt2_mlp", [inp])
        with torch.inference_mode():
            want0, want1 = mlp(torch.from_numpy(x))
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), want0.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(result.as_numpy("OUTPUT__1"), want1.numpy(), rtol=1e-5, atol=1e-6)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(24)))
    client = grpcclient.InferenceServerClient(pt2_server.grpc_url)
    config = client.get_model_config("pt2_mlp").config
    assert (config.platform, config.backend, config.default_model_filename) == ("torch_aoti", "pytorch", "model.pt2")


def test_a_shape_outside_the_exported_range_is_refused_with_the_packages_reason(pt2_server: Server) -> None:
    client = httpclient.InferenceServerClient(pt2_server.http_url)
    x = np.ones((MAX_BATCH + 1, 4), dtype=np.float32)
    inp = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("pt2_rows", [inp])
    assert refused.value.status() == "400"
    assert "input 'INPUT__0' is outside what the model was exported for" in str(refused.value)
    assert f"expected to be <= {MAX_BATCH}, but got: {MAX_BATCH + 1}" in str(refused.value)
    # The instance serves on.
    x = np.ones((MAX_BATCH, 4), dtype=np.float32)
    inp = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    assert client.infer("pt2_rows", [inp]).as_numpy("OUTPUT__0").shape == (MAX_BATCH, 3)


def test_a_sequence_packages_state_is_an_argument_and_a_returned_value(pt2_server: Server) -> None:
    # The state is forward()'s argument after the declared input and its second returned value, which the config
    # does not declare (as a TorchScript model's): each answer is the running sum of the sequence's inputs.
    client = httpclient.InferenceServerClient(pt2_server.http_url)
    got = []
    for i, value in enumerate((5, 7, 1)):
        inp = httpclient.InferInput("INPUT__0", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        result = client.infer("pt2_sequence_state", [inp], sequence_id=6262, sequence_start=i == 0,
                              sequence_end=i == 2)
        got.append(int(result.as_numpy("OUTPUT__0").reshape(-1)[0]))
    assert got == [5, 12, 13]


def test_a_broken_package_or_a_bare_one_fails_its_model_alone(pt2_server: Server) -> None:
    client = httpclient.InferenceServerClient(pt2_server.http_url)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert "could not load the AOTInductor package" in index["pt2_broken"]["reason"]
    assert "does not record its tensors' names" in index["pt2_bare"]["reason"]
    assert not client.is_model_ready("pt2_broken") and not client.is_model_ready("pt2_bare")
    assert client.is_model_ready("pt2_mlp") and client.is_model_ready("pt2_rows")


def test_a_package_for_another_device_or_cpu_is_refused() -> None:
    from conveyor.workers.backends.pytorch.aoti import argument_count, device_problem

    cuda = {"AOTI_DEVICE_KEY": "cuda"}
    assert "compiled for 'cuda' and the instance is KIND_CPU" in device_problem(cuda, "cpu", set())
    assert "KIND_GPU" in device_problem({"AOTI_DEVICE_KEY": "cpu"}, "cuda:0", set())
    assert "lacks (AVX512)" in device_problem({"AOTI_DEVICE_KEY": "cpu", "AOTI_CPU_ISA": "AVX512"}, "cpu", {"avx2"})
    assert device_problem({"AOTI_DEVICE_KEY": "cpu", "AOTI_CPU_ISA": "AVX2"}, "cpu", {"avx2"}) == ""
    spec = ('[1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": "builtins.tuple", '
            '"context": "null", "children_spec": [{"type": null, "context": null, "children_spec": []}, '
            '{"type": null, "context": null, "children_spec": []}]}, {"type": "builtins.dict", "context": "[]", '
            '"children_spec": []}]}]')
    assert argument_count([spec, "[]"]) == 2
    assert argument_count(["not json"]) is None


def test_the_package_is_found_by_its_file(tmp_path: Path) -> None:
    from conveyor.router.repository.scan import load_spec

    write_model(str(tmp_path), "m", 'name: "m"\nbackend: "pytorch"\nmax_batch_size: 0\n'
                'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    (tmp_path / "m" / "1" / "model.pt2").write_bytes(b"")
    spec = load_spec("m", str(tmp_path / "m"))
    assert (spec.config.platform, spec.config.default_model_filename) == ("torch_aoti", "model.pt2")
    (tmp_path / "m" / "1" / "model.pt").write_bytes(b"")  # TorchScript wins, as in Triton
    spec = load_spec("m", str(tmp_path / "m"))
    assert (spec.config.platform, spec.config.default_model_filename) == ("pytorch_libtorch", "model.pt")
