"""The transport-free KServe v2 data plane of an ingress process.

HTTP and gRPC adapters parse their wire form into ``InferInput``/``InferCall``,
call ``DataPlane.infer`` and render the ``InferResult`` back; errors are
``ConveyorError`` values the adapter renders once. This module validates a
request against the model's cached signature, writes the tensor bytes once into
this process's shared-memory arena, sends a descriptor to the router and turns
the answer into views of the worker's output block.

A decoupled model answers a request with any number of responses: only
``infer_stream`` (gRPC ModelStreamInfer) takes them; ``infer`` refuses such a
model as Triton does. The request's input block lives until its final response.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.limits import IngressLimits, too_many_elements, too_many_in_flight
from conveyor.ingress.model_cache import ModelSignature, ModelSignatureCache
from conveyor.ingress.request_hash import request_hash
from conveyor.ingress.router_link import RouterLink, error_from
from conveyor.ingress.shm_params import ShmPlacement
from conveyor.proto import messages as m
from conveyor.proto.datatypes import (
    deserialize_bytes,
    element_count,
    element_size,
    numpy_dtype,
    serialize_bytes,
)
from conveyor.proto.errors import ConveyorError, Status, invalid_arg, unsupported
from conveyor.shm.arena import RELEASED, Arena
from conveyor.shm.regions import RegionCache

TensorData = bytes | bytearray | memoryview | np.ndarray
# The answer to a sequence request names the host that holds the sequence, so a
# load balancer in front of several hosts can keep the sequence there.
ROUTING_HINT = "conveyor_host"
HOST = socket.gethostname()
_CLIENT = m.CLIENT_REGION_PREFIX


@dataclass(slots=True)
class InferInput:
    """One input: ``data`` is raw little-endian bytes (BYTES: length-prefixed) or
    an array already in the input's dtype (from JSON); or ``shm`` names where in a
    client-registered region the bytes already are (``data`` is None then)."""

    name: str
    datatype: str
    shape: list[int]
    data: TensorData | None
    parameters: dict[str, Any] = field(default_factory=dict)
    shm: ShmPlacement | None = None


@dataclass(slots=True)
class RequestedOutput:
    name: str
    classification: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)
    shm: ShmPlacement | None = None  # write it into this client region, return no bytes


@dataclass(slots=True)
class InferCall:
    model: str
    version: str
    inputs: list[InferInput]
    outputs: list[RequestedOutput] | None = None  # None: every output
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    timeout_s: float | None = None
    traceparent: str = ""  # the client's W3C trace context (HTTP header / gRPC metadata)


@dataclass(slots=True)
class OutputTensor:
    """An output as a view of shared memory: valid until ``InferResult.release``.

    ``raw`` is None for an output the worker wrote into a client's region: the
    response carries no bytes for it."""

    name: str
    datatype: str
    shape: list[int]
    raw: np.ndarray | None  # uint8 view

    def as_array(self) -> np.ndarray:
        if self.raw is None:
            raise ValueError(f"output '{self.name}' lies in the client's shared memory")
        if self.datatype == "BYTES":
            return deserialize_bytes(self.raw.data, element_count(self.shape)).reshape(self.shape)
        return self.raw.view(numpy_dtype(self.datatype)).reshape(self.shape)


@dataclass(slots=True)
class InferResult:
    model: str
    version: str
    id: str
    outputs: list[OutputTensor]
    parameters: dict[str, Any]
    _release: list[m.Release]
    _regions: RegionCache
    final: bool = True  # False for all but the last response of a decoupled model

    def release(self) -> None:
        """Hand the output block back to its worker; call once the bytes are copied out."""
        release_blocks(self._regions, self._release)
        self._release = []


@dataclass(slots=True)
class StreamError:
    """An error response of a decoupled model: ends its request when ``final``."""

    error: ConveyorError
    final: bool


class DataPlane:
    def __init__(
        self, link: RouterLink, arena: Arena, regions: RegionCache, drain: IngressDrain | None = None,
        limits: IngressLimits | None = None,
    ) -> None:
        self.link = link
        self.drain = drain or IngressDrain()
        self.arena = arena
        self.regions = regions
        self.limits = limits or IngressLimits()
        self.models = ModelSignatureCache(link)
        self._blocks: dict[int, int] = {}  # request id -> input block, freed on reply
        self._in_flight = 0  # requests between admission and their (final) response
        link.on_orphan = self.on_orphan

    def on_orphan(self, response: m.InferResponse) -> None:
        """A reply nobody waits for: free its memory (RouterLink calls this)."""
        self._finish(response)

    async def is_decoupled(self, model: str, version: str) -> bool:
        return (await self.models.get(model, version)).decoupled

    async def infer(self, call: InferCall, *, endpoint: str = "HTTP end point") -> InferResult:
        """One request, one response; ``endpoint`` names the caller in the refusal of a decoupled model."""
        received = time.time_ns() if self.link.tracing else 0  # the router decides whether it is sampled
        self.drain.admit()
        sig = await self.models.get(call.model, call.version)
        if sig.decoupled:
            raise unsupported(f"{endpoint} doesn't support models with decoupled transaction policy")
        self._admit()
        try:
            request = await self._validated(sig, call)
            if received:
                request.trace = m.TraceContext(received, call.traceparent)
            response = await self.link.infer(request)
        finally:
            self._in_flight -= 1
        self._finish_input(response.id)
        if response.trace_id:
            self.link.trace_end(response.trace_id)
        self.models.observe_generation(response.generation)
        if response.error is not None:
            release_blocks(self.regions, response.release)
            raise error_from(response.error)
        return self._result(response, call)

    async def infer_stream(self, call: InferCall) -> AsyncGenerator[InferResult | StreamError, None]:
        """Every response to ``call`` (a decoupled model may send none but the final
        flag: an ``InferResult`` without outputs), the last one ``final``."""
        self.drain.admit()
        sig = await self.models.get(call.model, call.version)
        self._admit()
        try:
            request = await self._validated(sig, call)
            async with contextlib.aclosing(self.link.infer_stream(request)) as responses:
                async for response in responses:
                    if response.final:
                        self._finish_input(response.id)
                    self.models.observe_generation(response.generation)
                    if response.error is not None:
                        release_blocks(self.regions, response.release)
                        yield StreamError(error_from(response.error), response.final)
                    else:
                        yield self._result(response, call)
        finally:
            self._in_flight -= 1

    def _admit(self) -> None:
        """Count one more request in flight, or refuse it (UNAVAILABLE) past the limit."""
        limit = self.limits.max_inflight
        if limit and self._in_flight >= limit:
            raise too_many_in_flight(limit)
        self._in_flight += 1

    async def _validated(self, sig: ModelSignature, call: InferCall) -> m.InferRequest:
        """``_send_inputs``, checked against a fresh signature before refusing: after a
        reload the cached one may be stale, and a valid request must not be refused."""
        try:
            return self._send_inputs(sig, call)
        except ConveyorError as exc:
            if exc.status is not Status.INVALID_ARG:
                raise
            fresh = await self.models.refresh(call.model, call.version)
            if fresh is sig:
                raise
            return self._send_inputs(fresh, call)

    def _send_inputs(self, sig: ModelSignature, call: InferCall) -> m.InferRequest:
        """Validate ``call``, write its inputs into this process's arena, describe it."""
        inputs = self._check_inputs(sig, call.inputs)
        outputs = self._check_outputs(sig, call.outputs)
        total = sum(_aligned(nbytes) for inp, nbytes in inputs if inp.shm is None)
        uses_shm = any(inp.shm for inp, _ in inputs) or any(o.region for o in outputs)
        block = self.arena.alloc(total)
        try:
            refs = self._write_inputs(block, inputs)
        except BaseException:
            self.arena.free(block)
            raise
        # Only the client's own deadline (gRPC) is a hard one; the "timeout"
        # parameter is the model's queue policy's business, in the router.
        deadline = 0
        if call.timeout_s:
            deadline = time.monotonic_ns() + int(call.timeout_s * 1e9)
        request = m.InferRequest(
            id=self.link.next_id(),
            model=call.model,
            version=call.version,
            inputs=refs,
            outputs=outputs,
            parameters=call.parameters,
            deadline_ns=deadline,
            flags=m.FLAG_CLIENT_SHM if uses_shm else 0,
            request_id=call.id,
        )
        if sig.response_cache and not uses_shm:  # a cached response cannot be written into a client region
            request.cache_key = request_hash(refs, self.arena.view, call.parameters)
        self._blocks[request.id] = block
        return request

    def _result(self, response: m.InferResponse, call: InferCall) -> InferResult:
        regions = self.regions
        out = [
            OutputTensor(
                t.name, t.datatype, t.shape,
                None if t.region.startswith(_CLIENT) else regions.view(t.region, t.offset, t.nbytes),
            )
            for t in response.outputs
        ]
        params = response.parameters
        if "sequence_id" in call.parameters:
            params = {**params, ROUTING_HINT: HOST}
        return InferResult(
            response.model, response.version, call.id, out, params, response.release, regions, response.final,
        )

    # --- validation ------------------------------------------------------------------

    def _check_inputs(
        self, sig: ModelSignature, inputs: list[InferInput]
    ) -> list[tuple[InferInput, int]]:
        checked: list[tuple[InferInput, int]] = []
        seen: set[str] = set()
        batch: int | None = None
        max_elements = self.limits.max_input_elements
        for inp in inputs:
            spec = sig.inputs.get(inp.name)
            if spec is None:
                raise invalid_arg(f"unexpected inference input '{inp.name}' for model '{sig.name}'")
            if inp.name in seen:
                raise invalid_arg(f"input '{inp.name}' appears more than once in the request")
            seen.add(inp.name)
            if inp.datatype != spec.datatype:
                raise invalid_arg(
                    f"inference input '{inp.name}' data-type is '{inp.datatype}', "
                    f"but model '{sig.name}' expects '{spec.datatype}'"
                )
            if any(d < 0 for d in inp.shape):
                raise invalid_arg(f"input '{inp.name}' has a negative dimension in shape {inp.shape}")
            dims = inp.shape
            if sig.max_batch_size > 0:
                if not dims:
                    raise invalid_arg(f"input '{inp.name}' has no batch dimension: shape {inp.shape}")
                if batch is None:
                    batch = dims[0]
                elif dims[0] != batch:
                    raise invalid_arg("all inputs of a request must have the same batch size")
                if dims[0] > sig.max_batch_size:
                    raise invalid_arg(
                        f"inference request batch-size must be <= {sig.max_batch_size} for '{sig.name}'"
                    )
                dims = dims[1:]
            if not spec.accepts(dims):
                expected = ([-1] if sig.max_batch_size > 0 else []) + list(spec.dims)
                raise invalid_arg(
                    f"unexpected shape for input '{inp.name}' for model '{sig.name}'. "
                    f"Expected {_fmt(expected)}, got {_fmt(inp.shape)}"
                )
            if max_elements and (count := element_count(inp.shape)) > max_elements:
                raise too_many_elements(inp.name, count, max_elements)
            if inp.shm is not None:
                checked.append((inp, self._shm_byte_size(sig, inp, inp.shm)))
                continue
            if inp.data is None:
                raise invalid_arg(f"input '{inp.name}' has no data")
            checked.append((inp, self._byte_size(inp)))
        missing = [name for name, spec in sig.inputs.items() if name not in seen and not spec.optional]
        if missing:
            raise invalid_arg(
                f"expected {len(sig.inputs)} inputs but got {len(seen)} inputs for model '{sig.name}'. "
                f"Got input(s) {sorted(seen)}, but missing required input(s) {missing}. "
                "Please provide all required input(s)."
            )
        return checked

    @staticmethod
    def _shm_byte_size(sig: ModelSignature, inp: InferInput, shm: ShmPlacement) -> int:
        if inp.data is not None:
            raise invalid_arg(f"input '{inp.name}' has both data and a shared memory region")
        if inp.datatype != "BYTES":
            expected = element_count(inp.shape) * element_size(inp.datatype)
            if shm.byte_size != expected:
                raise invalid_arg(
                    f"input byte size mismatch for input '{inp.name}' for model '{sig.name}'. "
                    f"Expected {expected}, got {shm.byte_size}"
                )
        return shm.byte_size

    @staticmethod
    def _byte_size(inp: InferInput) -> int:
        count = element_count(inp.shape)
        data = inp.data
        if isinstance(data, np.ndarray):
            if inp.datatype == "BYTES":
                if data.size != count:
                    raise invalid_arg(
                        f"input '{inp.name}' has {data.size} elements, its shape {inp.shape} needs {count}"
                    )
                inp.data = data = np.frombuffer(serialize_bytes(data), dtype=np.uint8)
                return data.nbytes
            if data.size != count:
                raise invalid_arg(
                    f"input '{inp.name}' has {data.size} elements, its shape {inp.shape} needs {count}"
                )
            return count * element_size(inp.datatype)
        nbytes = memoryview(data).nbytes  # type: ignore[arg-type]
        if inp.datatype == "BYTES":
            _check_bytes_count(inp.name, data, count)  # type: ignore[arg-type]
            return nbytes
        expected = count * element_size(inp.datatype)
        if nbytes != expected:
            raise invalid_arg(
                f"input byte size mismatch for input '{inp.name}' for model: "
                f"expected {expected} bytes for shape {inp.shape} of {inp.datatype}, got {nbytes}"
            )
        return nbytes

    @staticmethod
    def _check_outputs(sig: ModelSignature, outputs: list[RequestedOutput] | None) -> list[m.OutputSpec]:
        if outputs is None:
            return [m.OutputSpec(name) for name in sig.outputs]
        specs: list[m.OutputSpec] = []
        for out in outputs:
            if out.name not in sig.outputs:
                raise invalid_arg(f"unexpected inference output '{out.name}' for model '{sig.name}'")
            if out.classification < 0:
                raise invalid_arg(f"classification count for output '{out.name}' must be positive")
            shm = out.shm
            if shm is None:
                specs.append(m.OutputSpec(out.name, out.classification))
            else:
                specs.append(m.OutputSpec(out.name, out.classification, shm.region, shm.offset, shm.byte_size))
        return specs

    # --- shared memory -----------------------------------------------------------------

    def _write_inputs(self, block: int, inputs: list[tuple[InferInput, int]]) -> list[m.TensorRef]:
        refs: list[m.TensorRef] = []
        arena = self.arena
        offset = block
        for inp, nbytes in inputs:
            shm = inp.shm
            if shm is not None:
                # Already in the client's region: the router resolves the name.
                refs.append(m.TensorRef(inp.name, inp.datatype, inp.shape, _CLIENT + shm.region, shm.offset, nbytes))
                continue
            data = inp.data
            dst = arena.view(offset, nbytes)
            if isinstance(data, np.ndarray):
                # The one copy of these bytes: from the parsed request into shared memory.
                dtype = np.uint8 if inp.datatype == "BYTES" else numpy_dtype(inp.datatype)
                dst[:] = np.ascontiguousarray(data, dtype=dtype).reshape(-1).view(np.uint8)
            else:
                dst[:] = np.frombuffer(data, dtype=np.uint8)  # type: ignore[arg-type]
            refs.append(m.TensorRef(inp.name, inp.datatype, inp.shape, arena.name, offset, nbytes))
            offset += _aligned(nbytes)
        return refs

    def _finish_input(self, request_id: int) -> None:
        block = self._blocks.pop(request_id, None)
        if block is not None:
            self.arena.free(block)

    def _finish(self, response: m.InferResponse) -> None:
        if response.final:  # a decoupled model may read the inputs until its final response
            self._finish_input(response.id)
        release_blocks(self.regions, response.release)


def release_blocks(regions: RegionCache, releases: list[m.Release]) -> None:
    """Write each release flag: the worker reclaims a block once all its flags are set."""
    for rel in releases:
        try:
            regions.view(rel.region, rel.offset, 1)[0] = RELEASED
        except ConveyorError:
            pass  # the worker is gone, and its segment with it


def _check_bytes_count(name: str, data: bytes | memoryview, count: int) -> None:
    """Walk the length prefixes without building objects."""
    mv = memoryview(data).cast("B")
    pos, end, n = 0, len(mv), 0
    while pos < end:
        if pos + 4 > end:
            break
        pos += 4 + int.from_bytes(mv[pos : pos + 4], "little")
        n += 1
    if pos != end or n != count:
        raise invalid_arg(
            f"input '{name}' BYTES data does not hold exactly {count} length-prefixed element(s)"
        )


def _aligned(nbytes: int) -> int:
    """Each tensor starts on a 64-byte boundary, so backends get aligned views."""
    return (nbytes + 63) & ~63


def _fmt(shape: list[int] | tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"
