"""A real ``DataPlane`` over a fake router, for the fuzz tests of the ingress parsers.

Everything an ingress does with a request runs for real (validation against the
model's signature, the write into a shared-memory arena); only the router is a
stand-in that answers every request with an empty success, or a signature.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from conveyor.ingress.dataplane import DataPlane, InferCall
from conveyor.ingress.limits import IngressLimits
from conveyor.proto import messages as m
from conveyor.proto.control import ControlCalls, SignatureReply
from conveyor.proto.errors import unsupported
from conveyor.proto.signature import ModelSignature
from conveyor.shm.arena import Arena
from conveyor.shm.naming import segment_name
from conveyor.shm.regions import RegionCache

# A model with one input of every kind the parsers treat differently.
SIGNATURE: dict[str, Any] = {
    "name": "m",
    "max_batch_size": 4,
    "inputs": [
        {"name": "F", "datatype": "FP32", "dims": [-1]},
        {"name": "I", "datatype": "INT8", "dims": [2, 2], "optional": True},
        {"name": "S", "datatype": "BYTES", "dims": [-1], "optional": True},
        {"name": "B", "datatype": "BOOL", "dims": [3], "optional": True},
        {"name": "H", "datatype": "FP16", "dims": [-1], "optional": True},
    ],
    "outputs": [{"name": "Y", "datatype": "FP32", "dims": [-1]}],
}
INPUTS = [t["name"] for t in SIGNATURE["inputs"]]
GENERATION = 1  # the repository generation, as the router stamps its answers: the signature stays cached
INPUT_TYPES = {t["name"]: t["datatype"] for t in SIGNATURE["inputs"]}


class FakeRouterLink(ControlCalls):
    """Answers ``signature`` control calls and every inference with an empty success."""

    live = True  # RouterLink.live: the server is live (its router says so)

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.on_orphan: Any = None
        self.requests: list[m.InferRequest] = []
        self.refusals: list[tuple[str, str]] = []  # requests refused as invalid, counted for their model
        self.tracing = False

    def refused(self, model: str, version: str) -> None:
        self.refusals.append((model, version))

    def next_id(self) -> int:
        return next(self._ids)

    async def signature(self, model: str, version: str = "") -> SignatureReply:
        return SignatureReply(GENERATION, SIGNATURE)

    async def server_ready(self) -> bool:
        return True

    async def _control(self, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        raise unsupported(f"the fake router does not do '{op}'")

    async def infer(self, request: m.InferRequest) -> m.InferResponse:
        self.requests.append(request)
        return m.InferResponse(request.id, request.model, "1", generation=GENERATION)


@contextmanager
def data_plane(**limits: Any) -> Iterator[DataPlane]:
    """A ``DataPlane`` with a small arena of its own (unlinked on exit)."""
    arena = Arena(segment_name(f"fz{os.getpid()}", "ingress", serial=next(_serials)), 1 << 20)
    try:
        yield DataPlane(FakeRouterLink(), arena, RegionCache(), limits=IngressLimits(**limits))  # type: ignore[arg-type]
    finally:
        arena.close()


_serials = itertools.count()


def send(plane: DataPlane, call: InferCall) -> m.InferRequest:
    """Validate ``call`` and write it into the arena, as ``DataPlane.infer`` does; free it again."""
    request = plane._send_inputs(ModelSignature.from_wire(SIGNATURE), call)
    plane._finish_input(request.id)
    return request
