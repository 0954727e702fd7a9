"""A worker started for some GPUs reports them by physical id (the numbering of
``instance_group { gpus: [...] }``) and maps the router's devices back to its own."""

from __future__ import annotations

import pytest

from conveyor.deploy.instances import worker_environment
from conveyor.workers.devices import DeviceMap, gpu_backends

LEVEL = "unit"


def test_a_worker_for_gpu3_reports_cuda3_and_runs_it_as_its_cuda0() -> None:
    devices = DeviceMap(1, worker_environment("gpu3"))  # conveyor-worker@gpu3
    assert devices.reported() == ["cuda:3"]
    assert devices.local("cuda:3") == "cuda:0"
    assert devices.local("cpu") == "cpu"


def test_several_visible_gpus_keep_their_order() -> None:
    devices = DeviceMap(2, {"CUDA_VISIBLE_DEVICES": "5, 2"})
    assert devices.reported() == ["cuda:5", "cuda:2"]
    assert devices.local("cuda:2") == "cuda:1"


@pytest.mark.parametrize("environ", [
    {},  # every GPU, CUDA's own numbering
    {"CUDA_VISIBLE_DEVICES": ""},
    {"CUDA_VISIBLE_DEVICES": "GPU-8c1e0b5a-0000-0000-0000-000000000000,GPU-1234"},  # UUIDs
    {"CUDA_VISIBLE_DEVICES": "0"},  # fewer listed than seen cannot happen; fall back
])
def test_without_plain_ids_the_numbering_is_cudas(environ: dict[str, str]) -> None:
    devices = DeviceMap(2, environ)
    assert devices.reported() == ["cuda:0", "cuda:1"]
    assert devices.local("cuda:1") == "cuda:1"


def test_cuda_stops_at_the_first_invalid_entry() -> None:
    assert DeviceMap(1, {"CUDA_VISIBLE_DEVICES": "4,x,1"}).reported() == ["cuda:4"]


def test_no_gpu_reports_none() -> None:
    assert DeviceMap(0, {"CUDA_VISIBLE_DEVICES": "1"}).reported() == []


def test_gpu_backends_are_those_that_can_run_on_the_gpu() -> None:
    """Without a GPU none; with one, torch (a GPU host's build) and onnxruntime only with its CUDA provider."""
    import importlib.util

    import onnxruntime

    assert gpu_backends(0) == []
    found = gpu_backends(1)
    assert ("onnxruntime" in found) == ("CUDAExecutionProvider" in onnxruntime.get_available_providers())
    assert ("pytorch" in found) == (importlib.util.find_spec("torch") is not None)
