"""A real ``Router`` in this process, no process group: its two ROUTER sockets bound on
``inproc://`` endpoints, a DEALER for each ingress or worker a test plays, and the
router's handlers called directly, one loop turn at a time (``turn``)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import zmq

from conveyor.deploy import example_repo
from conveyor.ingress.router_link import error_from
from conveyor.proto import messages as m
from conveyor.proto.control import ControlCalls
from conveyor.router.config import RouterConfig
from conveyor.router.ledger import Ledger
from conveyor.router.lifecycle import ModelControlConfig
from conveyor.router.server import Router

INGRESS = b"ingress-1"
_endpoints = itertools.count()

# A model the router can serve: the router never reads model.py (strict config, no autocomplete).
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [{{ name: "IN" data_type: TYPE_INT32 dims: [ 4 ] }}]
output [{{ name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] }}]
{groups}
{extra}
"""


def write_model(repo: Path, name: str, instances: int = 1, extra: str = "") -> None:
    """``instances`` 0: no ``instance_group``, one instance on every worker."""
    groups = f"instance_group [{{ count: {instances} kind: KIND_CPU }}]" if instances else ""
    example_repo.write_model(repo, name, CONFIG.format(name=name, groups=groups, extra=extra),
                             {"model.py": "class TritonPythonModel:\n    pass\n"})


class RouterCore:
    def __init__(self, repo: Path) -> None:
        n = next(_endpoints)
        front, back = f"inproc://test-router-ingress-{os.getpid()}-{n}", f"inproc://test-router-workers-{n}"
        self.router = Router(RouterConfig((str(repo),), front, back, group=f"test-core-{os.getpid()}-{n}", spin_s=0,
                                          models=ModelControlConfig(strict_config=True)))
        self.router.load_repository()
        self.ledger: Ledger = self.router.ctx.ledger
        self._zmq = self.router.zmq
        self._back_endpoint = back
        self.ingress = self._dealer(front, INGRESS)
        self.workers: dict[bytes, zmq.Socket[bytes]] = {}
        self._ids = itertools.count(1)

    def _dealer(self, endpoint: str, identity: bytes) -> zmq.Socket[bytes]:
        sock = self._zmq.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTING_ID, identity)
        sock.connect(endpoint)
        # The ROUTER learns the peer when it next processes its commands, which a send may put off
        # (libzmq throttles that); reading its EVENTS does it now, so nothing sent to the peer is dropped.
        for bound in (self.router.front_sock, self.router.back_sock):
            bound.getsockopt(zmq.EVENTS)
        return sock

    def close(self) -> None:
        for sock in [self.ingress, *self.workers.values()]:
            sock.close(0)
        r = self.router
        r.self_link.close()
        r.front_sock.close(0)
        r.back_sock.close(0)
        r.loans.close()
        r.agent.close()

    # --- what peers send: one loop turn each ------------------------------------------------

    def turn(self) -> None:
        """The end of a loop turn: due timers fire, the outboxes leave."""
        self.router.dispatcher.fire_timers()
        self.router.back.flush()
        self.router.front.flush()

    def from_worker(self, worker: bytes, msg: m.WorkerToRouter) -> None:
        self.router._on_worker(worker, msg)
        self.turn()

    def from_ingress(self, msg: m.IngressToRouter) -> None:
        self.router._on_ingress(INGRESS, msg)
        self.turn()

    def join(self, worker: bytes) -> list[m.LoadModel]:
        """A worker says hello; the instances placed on it (their ``LoadModel``s)."""
        self.workers[worker] = self._dealer(self._back_endpoint, worker)
        self.from_worker(worker, m.WorkerHello(m.PROTOCOL_VERSION, os.getpid(), "test-host", []))
        return [msg for msg in self.to_worker(worker) if isinstance(msg, m.LoadModel)]

    def serve(self, worker: bytes) -> None:
        """``worker`` joins and reports each instance placed on it loaded."""
        for load in self.join(worker):
            self.from_worker(worker, m.ModelLoaded(load.model, load.version, load.instance))

    def infer(self, model: str, rows: int = 1, **parameters: Any) -> int:
        """An ``InferRequest`` from the ingress; its id."""
        rid = next(self._ids)
        tensor = m.TensorRef("IN", "INT32", [rows, 4], "conveyor.test.ingress", 0, 16 * rows)
        self.from_ingress(m.InferRequest(rid, model, "", [tensor], [m.OutputSpec("OUT")], parameters))
        return rid

    def answer(self, worker: bytes, batch: m.ExecBatch, error: m.ErrorInfo | None = None) -> None:
        """The worker's ``BatchResult`` for ``batch``: every item answered."""
        items = [m.ItemResult(item.id, error=error) for item in batch.items]
        self.from_worker(worker, m.BatchResult(batch.batch, items, 1, 1, 1))

    # --- what peers receive -----------------------------------------------------------------

    def to_worker(self, worker: bytes) -> list[m.RouterToWorker]:
        return [m.worker_inbox_decoder.decode(f) for f in _received(self.workers[worker])]

    def batches(self, worker: bytes) -> list[m.ExecBatch]:
        return [msg for msg in self.to_worker(worker) if isinstance(msg, m.ExecBatch)]

    def to_ingress(self) -> list[m.RouterToIngress]:
        return [m.router_reply_decoder.decode(f) for f in _received(self.ingress)]

    def responses(self) -> list[m.InferResponse]:
        return [msg for msg in self.to_ingress() if isinstance(msg, m.InferResponse)]


class CoreClient(ControlCalls):
    """``RouterClient`` over a ``RouterCore``, in this process: each op goes in as the ingress's
    ``ControlRequest`` and its reply is read back after that turn, over the real sockets (the wire
    as it is). An op the repository agent answers from its thread (the index, a registration, a
    system region) is not answered within the turn: it fails here."""

    def __init__(self, core: RouterCore) -> None:
        self._core = core
        self._ids = itertools.count(1)

    async def _control(self, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        cid = next(self._ids)
        self._core.from_ingress(m.ControlRequest(cid, op, args))
        replies = [r for r in self._core.to_ingress() if isinstance(r, m.ControlReply) and r.id == cid]
        assert replies, f"'{op}' was not answered within the turn"
        if replies[0].error is not None:
            raise error_from(replies[0].error)
        return replies[0].result


def _received(sock: zmq.Socket[bytes]) -> list[bytes]:
    """Every frame waiting on ``sock`` (inproc: what was flushed has arrived)."""
    frames: list[bytes] = []
    while sock.poll(0):
        frames += sock.recv_multipart()
    return frames
