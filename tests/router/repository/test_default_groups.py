"""Triton's default placement (router/repository/default_groups.py): no instance_group or KIND_AUTO
goes to the GPU when the workers report one, for GPU backends; /config shows the filled-in
group. The GPU branch runs here on fake device lists (``WorkerHello.devices``)."""

from __future__ import annotations

import itertools
import logging

import pytest
from google.protobuf import text_format

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.model_config import to_json
from conveyor.router.models import VersionState, build_entry
from conveyor.router.pool import WorkerInfo, WorkerPool
from conveyor.router.repository import default_groups
from conveyor.router.repository.default_groups import backend_gpus, filled_config, resolve
from conveyor.router.spec.model_spec import ModelSpec

LEVEL = "unit"

_index = itertools.count(100).__next__


def version(text: str, backend: str = "onnxruntime") -> VersionState:
    config = text_format.Parse(f'name: "m" backend: "{backend}" {text}', mc.ModelConfig())
    return build_entry(ModelSpec("m", "/x", config, versions={1: "/x/1/m"})).versions[1]


ALL_GPU_BACKENDS = ["onnxruntime", "pytorch", "tensorrt"]


def pool(*devices: list[str], gpu_backends: list[str] = ALL_GPU_BACKENDS) -> WorkerPool:
    workers = WorkerPool()
    for i, d in enumerate(devices):
        workers.join(WorkerInfo(f"w{i}".encode(), 1000 + i, "host", d, gpu_backends if d else []))
    return workers


def place(state: VersionState, workers: WorkerPool) -> None:
    resolve(state, backend_gpus(workers.workers.values(), state.config.backend), _index)
    workers.place(state.instances)


def groups(state: VersionState) -> list[dict[str, object]]:
    keys = ("name", "kind", "count", "gpus")
    shown = to_json(filled_config(state.config, state))["instance_group"]
    return [{k: g[k] for k in keys if g[k] != []} for g in shown]


def test_no_instance_group_goes_on_every_gpu() -> None:
    state = version("")
    workers = pool(["cuda:0"], ["cuda:1"])
    place(state, workers)
    assert not state.per_worker
    assert sorted((i.worker, i.load_device) for i in state.instances) == [(b"w0", "cuda:0"), (b"w1", "cuda:1")]
    assert groups(state) == [{"name": "m", "kind": "KIND_GPU", "count": 1, "gpus": [0, 1]}]


def test_no_instance_group_without_a_gpu_stays_per_worker_on_cpu(caplog: pytest.LogCaptureFixture) -> None:
    default_groups._said_cpu = False
    with caplog.at_level(logging.WARNING, logger="conveyor.router.repository.default_groups"):
        for _ in range(2):
            state = version("")
            resolve(state, [], _index)
            assert state.per_worker and state.auto_gpus == []
    said = [r for r in caplog.records if "no GPU that the backend can use" in r.getMessage()]
    assert len(said) == 1  # once, not once per model
    assert groups(state) == [{"name": "m", "kind": "KIND_CPU", "count": 1}]


def test_a_backend_that_cannot_use_the_gpu_stays_on_cpu() -> None:
    """A GPU host whose onnxruntime is a CPU build (no CUDAExecutionProvider): its ONNX models without an
    instance_group, or KIND_AUTO, run on the CPU instead of being unavailable; TorchScript goes on the GPU."""
    workers = pool(["cuda:0"], gpu_backends=["pytorch"])
    onnx = version("")
    place(onnx, workers)
    assert onnx.per_worker and onnx.auto_gpus == []
    auto = version("instance_group [ { count: 1 } ]")
    place(auto, workers)
    assert [i.load_device for i in auto.instances] == ["cpu"]
    torch = version("", backend="pytorch")
    place(torch, workers)
    assert [i.load_device for i in torch.instances] == ["cuda:0"]


def test_python_models_stay_on_cpu_even_with_a_gpu() -> None:
    state = version("", backend="python")
    resolve(state, [0], _index)
    assert state.per_worker and state.auto_gpus == []


def test_kind_auto_becomes_gpu_count_on_every_gpu() -> None:
    state = version("instance_group [ { count: 2 } ]")  # kind omitted: KIND_AUTO
    workers = pool(["cuda:0", "cuda:1"])
    place(state, workers)
    assert sorted(i.load_device for i in state.instances) == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    assert groups(state) == [{"name": "m_0", "kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}]


def test_kind_auto_with_listed_gpus() -> None:
    state = version("instance_group [ { count: 1 kind: KIND_AUTO gpus: [1] } ]")
    place(state, pool(["cuda:0", "cuda:1"]))
    assert [i.load_device for i in state.instances] == ["cuda:1"]
    assert groups(state)[0]["kind"] == "KIND_GPU"
    # A listed GPU that is missing makes the whole group CPU, as Triton.
    state = version("instance_group [ { count: 1 kind: KIND_AUTO gpus: [0, 3] } ]")
    place(state, pool(["cuda:0"]))
    assert [i.load_device for i in state.instances] == ["cpu", "cpu"]
    assert groups(state)[0]["kind"] == "KIND_CPU"


def test_kind_auto_without_gpu_is_cpu() -> None:
    state = version("instance_group [ { name: \"mine\" count: 3 kind: KIND_AUTO } ]")
    place(state, pool([]))
    assert [i.load_device for i in state.instances] == ["cpu"] * 3
    assert groups(state) == [{"name": "mine", "kind": "KIND_CPU", "count": 3}]


def test_explicit_kinds_are_untouched() -> None:
    state = version("instance_group [ { count: 1 kind: KIND_CPU }, { kind: KIND_GPU gpus: [0] } ]")
    place(state, pool(["cuda:0"]))
    assert sorted(i.load_device for i in state.instances) == ["cpu", "cuda:0"]
    assert [(g["name"], g["kind"], g["count"]) for g in groups(state)] == [
        ("m_0", "KIND_CPU", 1), ("m_1", "KIND_GPU", 1)]
