"""Where the router places GPU instances: ``gpus: [N]`` on a worker that reports
physical GPU N (a ``conveyor-worker@gpuN`` included), ``KIND_GPU`` without
``gpus`` on any GPU, spread over the GPUs."""

from __future__ import annotations

from google.protobuf import text_format

from conveyor.proto import model_config_pb2 as mc
from conveyor.router.models import Instance, InstanceState, VersionState, build_entry
from conveyor.router.pool import WorkerInfo, WorkerPool
from conveyor.router.spec.model_spec import ModelSpec

LEVEL = "unit"


def version(groups: str) -> VersionState:
    config = text_format.Parse(f'name: "g" {groups}', mc.ModelConfig())
    return build_entry(ModelSpec("g", "/x", config, versions={1: "/x/1/m"})).versions[1]


def pool(*devices: list[str]) -> WorkerPool:
    workers = WorkerPool()
    for i, d in enumerate(devices):
        workers.join(WorkerInfo(f"w{i}".encode(), 1000 + i, "host", d))
    return workers


def where(instances: list[Instance]) -> list[tuple[bytes | None, str]]:
    return [(i.worker, i.load_device) for i in instances]


def test_named_gpus_go_to_the_worker_that_owns_them() -> None:
    # Two per-GPU workers (conveyor-worker@gpu0, @gpu1): each reports its physical GPU.
    workers = pool(["cuda:0"], ["cuda:1"])
    state = version("instance_group [ { count: 1 kind: KIND_GPU gpus: [1] } ]")
    assert workers.place(state.instances) == state.instances
    assert where(state.instances) == [(b"w1", "cuda:1")]


def test_a_gpu_no_worker_has_stays_unplaced_with_the_reason() -> None:
    workers = pool(["cuda:0"])
    state = version("instance_group [ { count: 1 kind: KIND_GPU gpus: [3] } ]")
    assert workers.place(state.instances) == []
    assert state.instances[0].state is InstanceState.UNPLACED
    assert state.instances[0].error == "no worker has device 'cuda:3'"


def test_gpu_instances_without_gpus_spread_over_every_gpu() -> None:
    workers = pool(["cuda:0"], ["cuda:1"], [])  # two per-GPU workers and a CPU-only one
    state = version("instance_group [ { count: 2 kind: KIND_GPU } ]")
    workers.place(state.instances)
    assert sorted(where(state.instances)) == [(b"w0", "cuda:0"), (b"w1", "cuda:1")]
    # One worker with two GPUs: its GPUs share the instances.
    workers = pool(["cuda:0", "cuda:1"])
    state = version("instance_group [ { count: 2 kind: KIND_GPU } ]")
    workers.place(state.instances)
    assert sorted(i.load_device for i in state.instances) == ["cuda:0", "cuda:1"]


def test_without_any_gpu_the_reason_says_so() -> None:
    workers = pool([])
    state = version("instance_group [ { count: 1 kind: KIND_GPU } ]")
    assert workers.place(state.instances) == []
    # Triton's words (core's ValidateInstanceGroup on a host without GPUs)
    assert state.instances[0].error == "instance group g_0 of model g has kind KIND_GPU but no GPUs are available"
