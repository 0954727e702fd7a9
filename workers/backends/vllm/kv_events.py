"""vLLM's KV-cache events (``kv_events_config``), read in order by the worker that runs the engine.

The engine core publishes a batch of events per step (``BlockStored``, ``BlockRemoved``,
``AllBlocksCleared``) on a ZeroMQ PUB socket, each numbered, and keeps the last ``buffer_steps`` batches
for replay on a ROUTER socket (``vllm/distributed/kv_events.py``). PUB/SUB drops what a slow subscriber
cannot take, so a batch whose number skips some is a gap: the missed batches are asked of the replay
socket; if they are no longer there (or it does not answer), what the events said can no longer be
trusted and ``on_lost`` says so, once per gap, before the stream goes on from the next batch.

Each engine of a model with several publishes on ``ipc://`` sockets of its own, in its group's folder of
sockets (``engine_args``): a socket file takes a connection only from its owner, where an abstract or TCP
socket would give any local user the prompts' token ids. A model.json that configures the events itself
is read where it publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conveyor.deploy.runtime.group_paths import GROUP_MEMBER_ENV, run_dir

log = logging.getLogger(__name__)

ARG = "kv_events_config"
# How long the replay socket may take to answer: its publisher thread serves it between two batches.
REPLAY_TIMEOUT_S = 2.0
# Batches the engine keeps for replay (vLLM's default is 10,000 steps): a worker that falls this far
# behind has lost its record's truth anyway; ~1 MB of an engine core's memory at a few events a step.
BUFFER_STEPS = 1000
# Batches the subscriber's socket holds before ZeroMQ drops new ones (a gap, then replayed): the engine
# loop reads them between token hand-offs.
RECEIVE_HWM = 10_000
_END = -1  # the replay's last frame


@dataclass(frozen=True, slots=True)
class Endpoints:
    publish: str
    replay: str | None
    path: str = ""  # Conveyor's sockets' path, less the suffix: removed when the engine closes


def supported() -> bool:
    """Whether this vLLM names the request on its blocks' events (``session_id``): without
    it, the events cannot be tied to the prompts the router keyed, and are not asked for."""
    import inspect

    from vllm.v1.engine.async_llm import AsyncLLM

    return "session_id" in inspect.signature(AsyncLLM.generate).parameters


def engine_args(args: dict[str, Any]) -> tuple[dict[str, Any], Endpoints | None]:
    """``args`` with events published where this worker reads them, and where that is. A model.json that
    sets ``kv_events_config`` itself is kept: its events are read where it publishes them (a ``*`` host
    on this host), or, where it turns them off or publishes elsewhere than ZeroMQ, not at all."""
    own = args.get(ARG)
    if own is not None:
        config = own if isinstance(own, dict) else {}
        if not config.get("enable_kv_cache_events") or config.get("publisher", "zmq") != "zmq":
            return args, None
        publish = _local(str(config.get("endpoint", "tcp://*:5557")))
        replay = config.get("replay_endpoint")
        return args, Endpoints(publish, _local(str(replay)) if replay else None)
    base = os.path.join(_socket_folder(), f"kv-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    ours = Endpoints(f"ipc://{base}.pub", f"ipc://{base}.replay", base)
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": ours.publish,
              "replay_endpoint": ours.replay, "buffer_steps": BUFFER_STEPS}
    return {**args, ARG: config}, ours


def _socket_folder() -> str:
    """The group's folder of sockets (removed when the group stops), or a private one of this process."""
    group = os.environ.get(GROUP_MEMBER_ENV, "")
    if not group:
        return tempfile.mkdtemp(prefix="conveyor-kv-")  # mode 0700
    folder = run_dir(group)
    os.makedirs(folder, exist_ok=True)
    return folder


def remove_sockets(endpoints: Endpoints) -> None:
    """Conveyor's sockets of an engine that closed (its core binds them, and leaves them behind)."""
    if endpoints.path:
        for suffix in (".pub", ".replay"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(endpoints.path + suffix)


def _local(endpoint: str) -> str:
    """Where to connect to an endpoint the engine binds: its wildcard host is this host."""
    return endpoint.replace("://*:", "://127.0.0.1:").replace("://[::]:", "://127.0.0.1:")


class EventStream:
    """The engine's event batches, in order, each handed to ``on_events`` (its list of events), on the
    engine's event loop; ``on_lost()`` when some could not be had. ``run`` until cancelled."""

    def __init__(self, endpoints: Endpoints, on_events: Callable[[list[Any]], None],
                 on_lost: Callable[[], None]) -> None:
        self.endpoints = endpoints
        self.on_events = on_events
        self.on_lost = on_lost
        self.expected = 0  # the number of the next batch
        self.gaps = 0  # gaps found (each filled by the replay or lost)
        self.lost = 0  # gaps the replay could not fill

    async def run(self) -> None:
        import msgspec
        import zmq
        import zmq.asyncio
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        ctx = zmq.asyncio.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.endpoints.publish)
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                if seq < self.expected:
                    continue  # had already (from a replay)
                if seq > self.expected:
                    self.gaps += 1
                    await self._replay(ctx, decoder, seq)
                self._deliver(decoder, seq, frames[2])
        finally:
            sub.close(0)
            ctx.term()

    def _deliver(self, decoder: Any, seq: int, payload: bytes) -> None:
        self.expected = seq + 1
        try:
            batch = decoder.decode(payload)
        except Exception:  # a vLLM whose events this one cannot read: as good as lost
            log.warning("could not read a KV-cache event batch of the engine", exc_info=True)
            self.lost += 1
            self.on_lost()
            return
        self.on_events(batch.events)

    async def _replay(self, ctx: Any, decoder: Any, upto: int) -> None:
        """Batches ``expected`` .. ``upto - 1`` from the replay socket; those it no longer has are lost."""
        import zmq

        if self.endpoints.replay is not None:
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(self.endpoints.replay)
            try:
                await dealer.send_multipart((b"", self.expected.to_bytes(8, "big")))
                while True:
                    frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT_S)
                    if len(frames) != 4:
                        break
                    seq = int.from_bytes(frames[2], "big", signed=True)
                    if seq == _END:
                        break
                    if seq < self.expected or seq >= upto:
                        continue  # had already, or the live stream has it
                    if seq > self.expected:
                        self._lose(seq)  # older than the engine keeps
                    self._deliver(decoder, seq, frames[3])
            except TimeoutError:
                pass
            finally:
                dealer.close(0)
        if self.expected < upto:
            self._lose(upto)

    def _lose(self, upto: int) -> None:
        log.warning("lost KV-cache events %d..%d of the engine: its cached prefixes are forgotten",
                    self.expected, upto - 1)
        self.lost += 1
        self.expected = upto
        self.on_lost()
