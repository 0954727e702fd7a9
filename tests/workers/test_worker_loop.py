"""The worker loop (workers/worker.py) against the router's end of its real ZeroMQ link,
in this process, without a group: it says hello and beats, loads an instance, runs a
batch read from shared memory into a result (and a response straight to an ingress that
asked for one), turns a failing model into an error result, keeps its instances while the
router is silent (hello again on Rehello only), and leaves only when the router lets it go."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from conveyor.proto import messages as m
from conveyor.proto.errors import Status
from conveyor.shm.arena import Arena
from conveyor.shm.naming import segment_name
from conveyor.shm.regions import RegionCache
from conveyor.workers import router_session
from conveyor.workers import worker as worker_module
from conveyor.workers.worker import Worker, WorkerConfig
from tests.support.python_specs import RECORDING_MODEL, write
from tests.support.router_end import RouterEnd
from tests.support.waiting import eventually

LEVEL = "unit"

FAILING_MODEL = """
class TritonPythonModel:
    def execute(self, requests):
        raise RuntimeError("the model broke")
"""


class Running:
    """A worker running its loop on a thread, its router's end, and an ingress arena for inputs."""

    def __init__(self, tmp: Path, group: str) -> None:
        self.router = RouterEnd(f"ipc://{tmp}/router-workers.sock")
        self.worker = Worker(WorkerConfig(self.router.endpoint, group, arena_bytes=1 << 20, spin_s=0.0))
        self.inputs = Arena(segment_name(group, "ingress"), 1 << 16)
        self.regions = RegionCache()
        self.thread = threading.Thread(target=self.worker.run, daemon=True)
        self.thread.start()
        self.hello = self.router.expect(m.WorkerHello)
        self.batches = 0

    def load(self, name: str, path: str, config: bytes) -> m.ModelLoaded:
        self.router.send(m.LoadModel(name, "1", path, config, 0))
        return self.router.expect(m.ModelLoaded)

    def batch(self, model: str, *rows: list[int], reply_to: str = "") -> m.ExecBatch:
        items = []
        for i, row in enumerate(rows):
            data = np.array([row], np.int32)
            at = self.inputs.alloc(data.nbytes)
            self.inputs.view(at, data.nbytes)[:] = data.view(np.uint8).reshape(-1)
            ref = m.TensorRef("INPUT0", "INT32", [1, 2], self.inputs.name, at, data.nbytes)
            items.append(m.BatchItem(100 + i, [ref], [m.OutputSpec("ROWS")], reply_to=reply_to))
        self.batches += 1
        return m.ExecBatch(self.batches, model, "1", 0, items)

    def output(self, ref: m.TensorRef) -> np.ndarray:
        return self.regions.view(ref.region, ref.offset, ref.nbytes).view(np.int32).reshape(ref.shape).copy()

    def close(self) -> None:
        if self.thread.is_alive():
            self.worker.stop()
            self.worker.stop()  # a second stop: at once
            self.thread.join(10)
        self.regions.clear()
        self.inputs.close()
        self.router.close()


@pytest.fixture
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Running]:
    # The loop installs its signal handlers, which only the main thread may do.
    monkeypatch.setattr(worker_module.signal, "signal", lambda *_: None)
    run = Running(tmp_path, f"wl{os.getpid()}")
    try:
        yield run
    finally:
        run.close()
    assert not run.thread.is_alive(), "the worker loop did not stop"


def test_hello_then_a_heartbeat_every_second(running: Running) -> None:
    assert running.hello.pid == os.getpid() and running.hello.version == m.PROTOCOL_VERSION
    running.router.expect(m.Heartbeat, timeout=5)
    running.router.expect(m.Heartbeat, timeout=5)


def test_a_batch_in_a_result_out(running: Running, tmp_path: Path) -> None:
    path, config = write(tmp_path / "repo", "rec", RECORDING_MODEL)
    assert running.load("rec", path, config.SerializeToString()).error == ""
    running.router.send(running.batch("rec", [1, 2], [5, 6]))
    result = running.router.expect(m.BatchResult)
    assert result.batch == 1 and result.error is None
    assert [item.id for item in result.items] == [0, 1]  # by position in the batch
    # Each request gets its own outputs, from the worker's arena (two requests in the execute: +200).
    got = [running.output(item.outputs[0]) for item in result.items]
    assert [g.tolist() for g in got] == [[[201, 202]], [[205, 206]]]
    assert all(item.release for item in result.items)  # the consumer hands each block back


def test_a_response_goes_straight_to_the_ingress_that_asked(running: Running, tmp_path: Path) -> None:
    path, config = write(tmp_path / "repo", "rec", RECORDING_MODEL)
    assert running.load("rec", path, config.SerializeToString()).error == ""
    ingress = zmq.Context.instance().socket(zmq.PULL)  # type: ignore[var-annotated]
    ingress.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/ingress.sock"
    ingress.bind(endpoint)
    try:
        running.router.send(running.batch("rec", [3, 4], reply_to=endpoint))
        result = running.router.expect(m.BatchResult)
        # The router only counts it: no outputs of its own to forward.
        assert [(item.outputs, item.error) for item in result.items] == [([], None)]
        assert ingress.poll(10_000), "no response reached the ingress"
        response = m.router_reply_decoder.decode(ingress.recv_multipart()[0])
        assert isinstance(response, m.InferResponse) and response.id == 100 and response.final
        assert running.output(response.outputs[0]).tolist() == [[103, 104]]
    finally:
        ingress.close(0)


def test_a_failing_model_gives_an_error_result(running: Running, tmp_path: Path) -> None:
    path, config = write(tmp_path / "repo", "broken", FAILING_MODEL)
    assert running.load("broken", path, config.SerializeToString()).error == ""
    running.router.send(running.batch("broken", [1, 2]))
    result = running.router.expect(m.BatchResult)
    errors = [result.error] if result.error else [item.error for item in result.items]
    assert errors and all(e is not None and "the model broke" in e.message for e in errors), result


def test_a_batch_for_a_model_it_does_not_have_is_unavailable(running: Running) -> None:
    running.router.send(running.batch("nobody", [1, 2]))
    result = running.router.expect(m.BatchResult)
    assert result.error is not None and result.error.status == int(Status.UNAVAILABLE)
    assert "'nobody' is not loaded on this worker" in result.error.message


def test_a_load_that_fails_says_why(running: Running, tmp_path: Path) -> None:
    path, config = write(tmp_path / "repo", "rec", RECORDING_MODEL)
    os.remove(path)
    loaded = running.load("rec", path, config.SerializeToString())
    assert loaded.error, "a model file that is gone loaded"


def test_a_silent_router_costs_no_instance(running: Running, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A router busy (or gone) for a while is not one that forgot this worker: the worker keeps
    beating and keeps its instances, and says hello again only when told to (``Rehello``)."""
    monkeypatch.setattr(router_session, "ROUTER_QUIET_S", 0.3)
    path, config = write(tmp_path / "repo", "rec", RECORDING_MODEL)
    assert running.load("rec", path, config.SerializeToString()).error == ""
    for _ in range(3):  # three seconds of silence, ten times the bound
        running.router.expect(m.Heartbeat, timeout=5)
    assert sum(isinstance(msg, m.WorkerHello) for msg in running.router.seen) == 1  # the first one only
    running.router.send(running.batch("rec", [1, 2]))
    assert running.router.expect(m.BatchResult).error is None  # still loaded
    running.router.send(m.Rehello())
    again = running.router.expect(m.WorkerHello, timeout=10)
    assert again.pid == running.hello.pid
    running.router.send(running.batch("rec", [1, 2]))
    result = running.router.expect(m.BatchResult)
    assert result.error is not None and "not loaded on this worker" in result.error.message  # dropped on Rehello


def test_stop_leaves_only_when_the_router_lets_it_go(running: Running, tmp_path: Path) -> None:
    path, config = write(tmp_path / "repo", "rec", RECORDING_MODEL)
    assert running.load("rec", path, config.SerializeToString()).error == ""  # registered: it has work to hand back
    running.worker.stop()
    running.router.expect(m.WorkerLeaving, timeout=10)
    running.thread.join(0.5)
    assert running.thread.is_alive(), "it left before the router let it go"
    arena = running.worker.arena.name
    running.router.send(m.LeaveGranted())
    running.thread.join(10)
    assert not running.thread.is_alive()
    assert not os.path.exists(f"/dev/shm/{arena}"), "its arena outlived it"
    # The instance was closed: the model's finalize ran.
    marker = tmp_path / "repo" / "rec" / "finalized"
    eventually(marker.exists, timeout=5, what="the instance was not finalized", interval=0.05)
