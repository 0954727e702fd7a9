"""The engine's KV-cache event stream read from vLLM's own publisher (its PUB and replay sockets, on
ipc): batches arrive in order; those a subscriber missed (here: published before it connected) are
asked of the replay socket; those the engine no longer keeps are lost, said once, and the stream goes on;
a model.json that publishes its events itself is read where it publishes."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.deploy.runtime.group_paths import GROUP_MEMBER_ENV
from conveyor.workers.backends.vllm import kv_events
from conveyor.workers.backends.vllm.kv_events import Endpoints, EventStream

pytest.importorskip("vllm")
from vllm.distributed.kv_events import BlockRemoved, KVEventBatch, ZmqEventPublisher

LEVEL = "slow"

WAIT_S = 10.0


class _Reader:
    """An ``EventStream`` on an event loop of its own thread, as on an engine's."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.got: list[int] = []
        self.lost = 0
        self.stream = EventStream(endpoints, self._events, self._lost)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.task = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result()

    async def _start(self) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self.stream.run())

    def _events(self, events: list[Any]) -> None:
        self.got += [e.block_hashes[0] for e in events]

    def _lost(self) -> None:
        self.lost += 1

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while len(self.got) < count and time.monotonic() < deadline:
            time.sleep(0.02)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.task.cancel)
        time.sleep(0.1)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_S)


@pytest.fixture
def endpoints(tmp_path: Path) -> Endpoints:
    return Endpoints(f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay")


def _publisher(endpoints: Endpoints, buffer_steps: int) -> ZmqEventPublisher:
    return ZmqEventPublisher(0, endpoint=endpoints.publish, replay_endpoint=endpoints.replay,
                             buffer_steps=buffer_steps)


def _publish(pub: ZmqEventPublisher, *numbers: int) -> None:
    for n in numbers:
        pub.publish(KVEventBatch(ts=float(n), events=[BlockRemoved(block_hashes=[n], medium="GPU")]))


@pytest.fixture
def publisher(endpoints: Endpoints) -> Iterator[ZmqEventPublisher]:
    pub = _publisher(endpoints, 100)
    yield pub
    pub.shutdown()


def test_missed_batches_are_replayed_in_order(endpoints: Endpoints, publisher: ZmqEventPublisher) -> None:
    _publish(publisher, 0, 1, 2)  # before anyone reads: gone from PUB/SUB, kept for replay
    time.sleep(0.3)
    reader = _Reader(endpoints)
    try:
        time.sleep(0.3)  # subscribed
        _publish(publisher, 3, 4)
        reader.wait_for(5)
        assert reader.got == [0, 1, 2, 3, 4] and reader.lost == 0
        assert reader.stream.gaps == 1
    finally:
        reader.close()


def test_batches_the_engine_no_longer_keeps_are_lost_once(endpoints: Endpoints) -> None:
    pub = _publisher(endpoints, 2)  # keeps the last two batches only
    try:
        _publish(pub, 0, 1, 2, 3, 4)
        time.sleep(0.3)
        reader = _Reader(endpoints)
        try:
            time.sleep(0.3)
            _publish(pub, 5)
            reader.wait_for(2)
            assert reader.got == [4, 5]  # what the replay still had (the last two), 5 among them
            assert reader.lost == 1
        finally:
            reader.close()
    finally:
        pub.shutdown()


def test_conveyor_asks_for_events_on_sockets_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_RUN_DIR", str(tmp_path))
    monkeypatch.setenv(GROUP_MEMBER_ENV, "g")
    args, ours = kv_events.engine_args({"model": "m"})
    assert ours is not None and ours.replay is not None
    assert ours.publish.startswith(f"ipc://{tmp_path / 'g'}/")  # the group's folder, removed when it stops
    assert args[kv_events.ARG]["enable_kv_cache_events"] and args[kv_events.ARG]["endpoint"] == ours.publish
    assert kv_events.engine_args({"model": "m"})[1] != ours  # each engine its own
    Path(ours.path + ".pub").touch()
    kv_events.remove_sockets(ours)
    assert not Path(ours.path + ".pub").exists()
    monkeypatch.delenv(GROUP_MEMBER_ENV)
    alone = kv_events.engine_args({"model": "m"})[1]  # a worker of no group: a folder of its own
    assert alone is not None
    folder = Path(alone.path).parent
    assert (folder.stat().st_mode & 0o777) == 0o700
    folder.rmdir()


def test_a_model_json_that_publishes_itself_is_read_where_it_publishes() -> None:
    own = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
           "replay_endpoint": "tcp://*:5558"}
    args, where = kv_events.engine_args({"kv_events_config": own})
    assert args["kv_events_config"] is own
    assert where == Endpoints("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558")
    assert kv_events.engine_args({"kv_events_config": {"enable_kv_cache_events": False}})[1] is None
