"""Which instances may run short batches on the worker's main thread, and the
switch that stops it when a model makes a call only the main loop can answer."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th

from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.repository.scan import load_spec
from conveyor.workers.backends.python.backend import PythonBackend
from conveyor.workers.batch_io import IoPlan
from conveyor.workers.devices import DeviceMap
from conveyor.workers.inline import (
    FRAMEWORK_INLINE_MAX_NS,
    INLINE_AFTER,
    INLINE_MAX_INPUT_BYTES,
    INLINE_MAX_NS,
    inline_allowed,
)
from conveyor.workers.inline_switch import InlineSwitch
from conveyor.workers.instances import LoadedInstance, begin_load, close_instance
from tests.support.ensemble_models import identity_int32
from tests.support.group import start_server
from tests.support.python_models import _simple_config, write_model
from tests.support.python_specs import RECORDING_MODEL, write

LEVEL = "e2e"

# Answers 1.0 when execute ran on the worker's main thread. The second copy's text
# names InferenceRequest (as a BLS model would), so it must always run on its own thread.
WHICH_THREAD_MODEL = '''
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        main = float(threading.current_thread() is threading.main_thread())
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([main], np.float32))])
                for _ in requests]
'''

BLS_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        call = pb_utils.InferenceRequest(model_name="other", inputs=[], requested_output_names=["Y"])
        return [call.exec() for _ in requests]
'''


@pytest.fixture(autouse=True)
def switch_on() -> Iterator[None]:
    InlineSwitch.on = True
    yield
    InlineSwitch.on = True


def test_cpu_python_models_without_bls_may_run_inline(tmp_path: Path) -> None:
    path, config = write(tmp_path, "plain", RECORDING_MODEL)
    backend = PythonBackend(path, config, "cpu")
    try:
        assert inline_allowed(backend, config, "cpu", path)
        assert not inline_allowed(backend, config, "cuda:0", path)  # GPU contexts are per thread
        config.model_transaction_policy.decoupled = True
        assert not inline_allowed(backend, config, "cpu", path)  # responses come from other threads
    finally:
        backend.close()


def test_python_models_that_may_call_bls_never_run_inline(tmp_path: Path) -> None:
    path, config = write(tmp_path, "caller", BLS_MODEL)
    backend = PythonBackend(path, config, "cpu")
    try:
        assert not inline_allowed(backend, config, "cpu", path)
    finally:
        backend.close()


def test_a_main_thread_bls_call_fails_retryably_and_stops_inline_batches() -> None:
    assert threading.current_thread() is threading.main_thread()
    elsewhere: list[BaseException] = []

    def on_a_model_thread() -> None:
        try:
            InlineSwitch.refuse_on_main_thread("BLS call")
        except BaseException as exc:  # pragma: no cover - would fail the assertion below
            elsewhere.append(exc)

    t = threading.Thread(target=on_a_model_thread)
    t.start()
    t.join()
    assert not elsewhere and InlineSwitch.on  # an instance's own thread: nothing to refuse
    with pytest.raises(ConveyorError) as caught:
        InlineSwitch.refuse_on_main_thread("BLS call")
    assert caught.value.status is Status.UNAVAILABLE and "retry" in caught.value.message
    assert not InlineSwitch.on


def test_short_batches_move_to_the_main_thread_unless_the_model_may_call_bls(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    repo = str(tmp_path_factory.mktemp("inline"))
    write_model(repo, "plain", WHICH_THREAD_MODEL, _simple_config("plain"))
    write_model(repo, "caller", WHICH_THREAD_MODEL + "# pb_utils.InferenceRequest(...) would make a BLS call\n",
                _simple_config("caller"))
    write_model(repo, "sized", WHICH_THREAD_MODEL, _simple_config("sized").replace("dims: [ 1 ]", "dims: [ -1 ]", 1))
    cpus = os.sched_getaffinity(0)
    pinned = len(cpus) > 1  # the main thread on a dispatch core (deploy/runtime/dispatch_cpu.py) takes the same batches
    server = start_server(repo, f"in{os.getpid()}", "--workers", "1", "--grpc-ingress", "0",
                          "--dispatch-cpu", str(min(cpus)) if pinned else "off", grpc=False)
    try:
        client = th.InferenceServerClient(server.http_url)
        seen: dict[str, list[float]] = {"plain": [], "caller": []}
        for model, threads in seen.items():
            for _ in range(64):
                x = th.InferInput("INPUT0", [1], "FP32")
                x.set_data_from_numpy(np.zeros(1, np.float32))
                threads.append(float(client.infer(model, [x]).as_numpy("OUTPUT0")[0]))
        # A big request never stalls the main loop (and its heartbeats), however short the ones before.
        sized = []
        for n in [1] * 24 + [(1 << 20) // 4, (INLINE_MAX_INPUT_BYTES // 4) + 1]:
            x = th.InferInput("INPUT0", [n], "FP32")
            x.set_data_from_numpy(np.zeros(n, np.float32))
            sized.append(float(client.infer("sized", [x]).as_numpy("OUTPUT0")[0]))
        client.close()
        assert sum(sized[8:24]) >= 8 and sized[-1] == 0.0
        assert seen["plain"][:8] == [0.0] * 8  # measured on the instance's thread first
        # Then short batches run on the main thread (a busy machine may make a few long ones).
        assert sum(seen["plain"][8:]) >= 28
        assert seen["caller"] == [0.0] * 64
    finally:
        assert server.stop() == 0


def _batch(*input_bytes: int) -> m.ExecBatch:
    items = [m.BatchItem(i, [m.TensorRef("INPUT0", "FP32", [n // 4], "arena", 0, n)], [])
             for i, n in enumerate(input_bytes)]
    return m.ExecBatch(1, "model", "1", 0, items)


def test_a_megabyte_batch_runs_on_the_main_thread_and_one_over_the_cap_on_the_instances() -> None:
    """A short model's 1 MiB batch runs inline, also on a dispatch core (a hand-off across cores
    cost the shared-memory cases a third of their throughput); a batch over the cap does not,
    nor one behind a batch still queued on the instance's thread."""
    inst = LoadedInstance(("model", "1", 0), None, mc.ModelConfig(), IoPlan.from_config(mc.ModelConfig(), {}),
                          inline_ok=True, exec_ns=50_000.0, batches=INLINE_AFTER)
    try:
        assert inst.runs_inline(_batch(64))
        assert inst.runs_inline(_batch(1 << 20))
        assert inst.runs_inline(_batch(INLINE_MAX_INPUT_BYTES // 2, INLINE_MAX_INPUT_BYTES // 2))
        assert not inst.runs_inline(_batch(INLINE_MAX_INPUT_BYTES // 2, INLINE_MAX_INPUT_BYTES // 2 + 4))
        inst.submitted = 1  # one batch on the instance's thread: the next waits behind it
        assert not inst.runs_inline(_batch(64))
        inst.finished = 1
        inst.exec_ns = INLINE_MAX_NS  # its batches got long
        assert not inst.runs_inline(_batch(64))
    finally:
        inst.executor.shutdown()



def _loaded(repo: Path, name: str) -> LoadedInstance:
    """Instance 0 of model ``name`` in ``repo``, loaded as the worker loads one."""
    spec = load_spec(name, str(repo / name))
    assert not spec.error, spec.error
    msg = m.LoadModel(name, "1", spec.versions[1], spec.config.SerializeToString(), 0)
    posted: list[bytes] = []
    inst = begin_load(msg, DeviceMap(0, {}), posted.append)
    inst.submit(lambda: None).result(timeout=60)  # after the load, on the instance's thread
    assert inst.backend is not None and inst.inline_ok, posted
    return inst


def test_a_framework_call_on_cold_caches_still_runs_on_the_main_thread(tmp_path: Path) -> None:
    """A 100-tree FIL call right after the worker was idle took 550-900 µs at c=1 on the 2-vCPU VM:
    a framework backend's batch that long runs on the main thread (its bound), a Python model's does
    not (its bound is as it was)."""
    cold_call_ns = 900_000
    assert INLINE_MAX_NS < cold_call_ns < FRAMEWORK_INLINE_MAX_NS
    identity_int32(str(tmp_path), "framework")  # onnxruntime: runs_on_any_thread, as fil, openvino, tensorflow
    write(tmp_path, "python", RECORDING_MODEL)
    for name, bound in (("framework", FRAMEWORK_INLINE_MAX_NS), ("python", INLINE_MAX_NS)):
        inst = _loaded(tmp_path, name)
        try:
            assert inst.inline_max_ns == bound
            inst.batches, inst.exec_ns = INLINE_AFTER, cold_call_ns
            assert inst.runs_inline(_batch(64)) is (name == "framework")
            inst.exec_ns = FRAMEWORK_INLINE_MAX_NS  # long batches leave the main thread whatever the backend
            assert not inst.runs_inline(_batch(64))
        finally:
            close_instance(inst).result(timeout=60)
