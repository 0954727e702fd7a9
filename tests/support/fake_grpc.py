"""Stand-ins behind the gRPC servicer, for its tests over loopback: a router link that
knows one model ``echo``, and a data plane that echoes every input."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from conveyor.ingress.dataplane import InferCall, InferResult, OutputTensor, SendTurn
from conveyor.ingress.limits import IngressLimits
from conveyor.proto.control import ControlCalls
from conveyor.proto.datatypes import serialize_bytes
from conveyor.proto.errors import invalid_arg, not_found, unavailable

METADATA = {
    "name": "echo",
    "versions": ["1"],
    "platform": "python",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
    "outputs": [{"name": "OUT_x", "datatype": "FP32", "shape": [-1]}],
}


class FakeLink(ControlCalls):
    live = True  # RouterLink.live: the server is live (its router says so)

    def __init__(self) -> None:
        self.ready: bool | None = True  # None: the router does not answer
        self.tracing = False
        self.ngh2_failures = 0  # ngh2_failed() calls (RouterLink: the hello that tells the router)

    def ngh2_failed(self) -> None:
        self.ngh2_failures += 1

    async def server_ready(self) -> bool:
        if self.ready is None:
            raise unavailable("the router did not answer in time")
        return self.ready

    async def model_ready(self, model: str, version: str = "") -> bool:
        return model == "echo"

    async def log_settings(self, settings: dict[str, Any] | None = None) -> dict[str, Any]:
        level = int((settings or {}).get("log_verbose_level", 0))
        return {"log_file": "", "log_info": True, "log_verbose_level": level}

    async def trace_settings(self, model: str = "", settings: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"trace_level": (settings or {}).get("trace_level") or ["OFF"], "trace_rate": "1000"}

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        _known(model)
        return METADATA

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        _known(model)
        return {"name": "echo", "max_batch_size": 4, "input": [{"name": "x", "data_type": "TYPE_FP32"}]}

    async def model_stats(self, model: str = "", version: str = "") -> dict[str, Any]:
        _known(model)
        return {"model_stats": [{"name": "echo", "version": "1", "inference_count": 3}]}

    async def _control(self, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        raise AssertionError(op)  # an op the servicer's tests do not reach


def _known(model: str) -> None:
    if model not in ("echo", ""):
        raise not_found(f"Request for unknown model: '{model}' is not found")


class FakeDataPlane:
    """Echoes every input as ``OUT_<name>``; model "fail" is rejected, "crash"
    raises, and a ``delay_ms`` request parameter makes it wait first."""

    def __init__(self) -> None:
        self.limits = IngressLimits()
        self.calls: list[InferCall] = []
        self.cancelled = 0
        self.released = 0

    async def is_decoupled(self, model: str, version: str) -> bool:
        return False

    def start(self, call: InferCall) -> None:
        """No cached signature here: every call takes ``infer``'s way (the task)."""
        return None

    async def infer(self, call: InferCall, *, endpoint: str = "", turn: SendTurn | None = None) -> InferResult:
        if turn is not None:  # "sent" in the stream's order, as the real data plane sends to the router
            await turn.wait()
            turn.done()
        self.calls.append(call)
        if call.model == "fail":
            raise invalid_arg(f"bad request {call.id}")
        if call.model == "crash":
            raise RuntimeError("kaboom")
        delay = call.parameters.get("delay_ms", 0)
        if delay:
            try:
                await asyncio.sleep(delay / 1000)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        outputs = []
        for inp in call.inputs:
            data = inp.data
            if isinstance(data, np.ndarray):
                raw = serialize_bytes(data) if inp.datatype == "BYTES" else data.tobytes()
            else:
                raw = bytes(data)  # type: ignore[arg-type]
            outputs.append(OutputTensor("OUT_" + inp.name, inp.datatype, inp.shape, np.frombuffer(raw, np.uint8)))
        plane = self

        class Result(InferResult):
            def release(self) -> None:
                plane.released += 1

        return Result(call.model, call.version or "1", call.id, outputs, {}, [], None)  # type: ignore[arg-type]
