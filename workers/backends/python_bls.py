"""BLS for Python models: ``pb_utils.InferenceRequest.exec()`` and
``async_exec()`` go through the worker's ``BlsLink`` to the router, so the
callee is queued, batched, counted and placed like any client's request.

The request's tensors are written once into this worker's arena (the callee
reads them in place); each response's outputs are read from the callee's
output block, copied into numpy arrays for the model, and the block released.

A request that sets no ``timeout`` gets ``DEFAULT_QUEUE_TIMEOUT_S`` as its
queue deadline: a model that calls itself on its only instance (or a cycle of
models that fills every instance) would otherwise wait forever for an instance
that waits for it. The deadline bounds the wait in the router's queue only,
never the callee's run.
"""

from __future__ import annotations

import asyncio
import json
import queue
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from conveyor.proto import messages as m
from conveyor.proto.datatypes import datatype_of, deserialize_bytes, element_count, numpy_dtype, serialize_bytes
from conveyor.proto.errors import ConveyorError
from conveyor.shm.regions import RegionCache
from conveyor.workers.backends.python_utils import InferenceRequest, InferenceResponse, Tensor, TritonError
from conveyor.workers.bls_link import BlsLink

DEFAULT_QUEUE_TIMEOUT_S = 60.0


class BlsClient:
    """Implements ``python_utils.bls.BlsExecutor`` over a ``BlsLink``."""

    def __init__(self, link: BlsLink, regions: RegionCache) -> None:
        self.link = link
        self.regions = regions

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        answers: queue.SimpleQueue[m.InferResponse] = queue.SimpleQueue()
        self._send(request, answers.put)
        streamed: list[m.InferResponse] = []
        while not (msg := answers.get()).final:
            streamed.append(msg)
        return self._one(request, streamed, msg)

    async def infer_async(self, request: InferenceRequest) -> InferenceResponse:
        loop = asyncio.get_running_loop()
        answers: asyncio.Queue[m.InferResponse] = asyncio.Queue()
        self._send(request, lambda msg: loop.call_soon_threadsafe(answers.put_nowait, msg))
        streamed: list[m.InferResponse] = []
        while not (msg := await answers.get()).final:
            streamed.append(msg)
        return self._one(request, streamed, msg)

    def stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]:
        """Every response of a decoupled callee as it comes, the final one last
        (without outputs when the callee sent only the final flag)."""
        answers: queue.SimpleQueue[m.InferResponse] = queue.SimpleQueue()
        rid = self._send(request, answers.put)
        final = False
        try:
            while not final:
                msg = answers.get()
                final = msg.final
                yield self._response(msg)
        finally:
            if not final:  # the model stopped iterating: cancel, and release what still comes
                self.link.cancel(rid, self._release)
                while not answers.empty():
                    self._release(answers.get_nowait())

    # --- descriptors ---------------------------------------------------------------------

    def _send(self, request: InferenceRequest, on_response: Any) -> int:
        tensors: list[tuple[str, str, list[int], np.ndarray]] = []
        for tensor in request.inputs():
            array = tensor.as_numpy()
            datatype = datatype_of(array)
            data = np.frombuffer(serialize_bytes(array), np.uint8) if datatype == "BYTES" else array
            tensors.append((tensor.name(), datatype, list(array.shape), np.ascontiguousarray(data)))
        total = sum(_aligned(t[3].nbytes) for t in tensors)
        block = self.link.alloc(total) if total else None
        refs: list[m.TensorRef] = []
        arena = self.link.arena
        offset = block or 0
        for name, datatype, shape, data in tensors:
            arena.view(offset, data.nbytes)[:] = data.reshape(-1).view(np.uint8)
            refs.append(m.TensorRef(name, datatype, shape, arena.name, offset, data.nbytes))
            offset += _aligned(data.nbytes)
        timeout_us = request.timeout()
        wait_ns = timeout_us * 1000 if timeout_us > 0 else int(DEFAULT_QUEUE_TIMEOUT_S * 1e9)
        version = request.model_version()
        rid = self.link.next_id()
        self.link.submit(
            m.InferRequest(
                rid, request.model_name(), "" if version < 0 else str(version), refs,
                [m.OutputSpec(name) for name in request.requested_output_names()],
                parameters=_parameters(request), deadline_ns=time.monotonic_ns() + wait_ns,
                request_id=request.request_id(),
            ),
            block, on_response,
        )
        return rid

    def _one(self, request: InferenceRequest, streamed: list[m.InferResponse], final: m.InferResponse) -> Any:
        if not streamed:
            return self._response(final)
        for msg in [*streamed, final]:
            self._release(msg)
        return InferenceResponse(error=TritonError(
            f"model '{request.model_name()}' is decoupled: call exec(decoupled=True) to get its responses",
            TritonError.UNSUPPORTED,
        ))

    def _response(self, msg: m.InferResponse) -> InferenceResponse:
        if msg.error is not None:
            self._release(msg)
            return InferenceResponse(error=TritonError(msg.error.message, msg.error.status))
        try:
            return InferenceResponse([Tensor(ref.name, self._array(ref)) for ref in msg.outputs])
        finally:
            self._release(msg)

    def _array(self, ref: m.TensorRef) -> np.ndarray:
        """A copy the model owns: the callee's block goes back right after."""
        raw = self.regions.view(ref.region, ref.offset, ref.nbytes)
        if ref.datatype == "BYTES":
            return deserialize_bytes(raw.data, element_count(ref.shape)).reshape(ref.shape)
        return raw.view(numpy_dtype(ref.datatype)).reshape(ref.shape).copy()

    def _release(self, msg: m.InferResponse) -> None:
        for rel in msg.release:
            try:
                self.regions.view(rel.region, rel.offset, 1)[0] = 1
            except ConveyorError:
                pass  # the callee's worker is gone, and its segment with it


def _parameters(request: InferenceRequest) -> dict[str, Any]:
    params: dict[str, Any] = json.loads(request.parameters())
    if request.correlation_id():
        params["sequence_id"] = request.correlation_id()
    flags = request.flags()
    if flags & 1:
        params["sequence_start"] = True
    if flags & 2:
        params["sequence_end"] = True
    return params


def _aligned(nbytes: int) -> int:
    return (nbytes + 63) & ~63
