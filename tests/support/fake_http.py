"""Stand-ins behind the HTTP app, for its tests without sockets: a router link that
answers control calls from a table, and a data plane that echoes every input."""

from __future__ import annotations

from typing import Any

import numpy as np

from conveyor.ingress.dataplane import InferCall, InferResult, OutputTensor
from conveyor.ingress.limits import IngressLimits
from conveyor.proto import messages as m
from conveyor.proto.control import ControlCalls
from conveyor.proto.datatypes import serialize_bytes


class FakeLink(ControlCalls):
    """Each op answered from ``answers`` (an exception: raised); ``calls``: the ops and their
    arguments as they would go to the router."""

    live = True  # RouterLink.live: the server is live (its router says so)

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def _control(self, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        self.calls.append((op, args))
        answer = self.answers[op]
        if isinstance(answer, BaseException):
            raise answer
        return answer


class FakeRegions:
    def __init__(self) -> None:
        self.released = 0

    def view(self, name: str, offset: int, nbytes: int) -> np.ndarray:
        self.released += 1
        return np.zeros(1, np.uint8)

    def array(self, name: str) -> np.ndarray:
        """The whole 'segment' (``release_blocks`` writes a flag into it)."""
        self.released += 1
        return np.zeros(64, np.uint8)


class KnownModels:
    """Every model is known (the ingress's signature cache, as ``Infer.model_first`` asks it)."""

    def cached(self, model: str, version: str) -> object:
        return model


class EchoPlane:
    """Each input comes back as output ``<name>_OUT``, via 'shared memory' (a copy)."""

    def __init__(self) -> None:
        self.calls: list[InferCall] = []
        self.regions = FakeRegions()
        self.error: Exception | None = None
        self.limits = IngressLimits()
        self.refusals: list[str] = []
        self.models = KnownModels()

    def refused(self, model: str, version: str, exc: Exception) -> None:
        self.refusals.append(model)

    async def infer(self, call: InferCall) -> InferResult:
        self.calls.append(call)
        if self.error is not None:
            raise self.error
        outs = []
        for inp in call.inputs:
            data = inp.data
            if isinstance(data, np.ndarray) and data.dtype == object:
                raw = np.frombuffer(serialize_bytes(data), np.uint8)
            elif isinstance(data, np.ndarray):
                raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8).copy()
            else:
                raw = np.frombuffer(bytes(data), np.uint8)  # type: ignore[arg-type]
            outs.append(OutputTensor(inp.name + "_OUT", inp.datatype, inp.shape, raw))
        release = [m.Release("r", 0)]
        return InferResult(call.model, call.version or "1", call.id, outs, {}, release, self.regions)  # type: ignore[arg-type]


ANSWERS: dict[str, Any] = {
    "server_ready": True,
    "model_ready": True,
    "model_metadata": {"name": "simple", "versions": ["1"], "platform": "onnxruntime_onnx"},
    "model_config": {"name": "simple", "max_batch_size": 8},
    "model_stats": {"model_stats": []},
}
