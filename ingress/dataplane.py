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

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncGenerator, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.limits import IngressLimits, too_many_in_flight
from conveyor.ingress.model_cache import ModelSignatureCache
from conveyor.ingress.prefix_key import prefix_key
from conveyor.ingress.request_hash import request_hash
from conveyor.ingress.router_link import RouterLink, error_from
from conveyor.proto import messages as m
from conveyor.proto.datatypes import deserialize_bytes, element_count, numpy_dtype, split_bytes
from conveyor.proto.errors import ConveyorError, Status, internal, unsupported
from conveyor.proto.request_checks import (
    InferInput,
    RequestedOutput,
    check_inputs,
    check_outputs,
    inputs_nbytes,
    remember_verdict,
    write_inputs,
)
from conveyor.proto.signature import ModelSignature
from conveyor.shm.arena import RELEASED, Arena
from conveyor.shm.regions import RegionCache

# The answer to a sequence request names the host that holds the sequence, so a
# load balancer in front of several hosts can keep the sequence there.
ROUTING_HINT = "conveyor_host"
HOST = socket.gethostname()
_CLIENT = m.CLIENT_REGION_PREFIX
# What the ingress refuses as the client's fault: counted as REJECTED, and checked again against a fresh signature.
_REFUSALS = frozenset((Status.INVALID_ARG, Status.CLIENT_MISTAKE))


class SendTurn:
    """Requests of one ordered channel (a gRPC stream) reach the router in the order they came:
    each one is sent only after the one before it was sent, or failed without being sent.
    Triton enqueues a stream's requests in arrival order, and a sequence's START must reach the
    sequence batcher before the requests that follow it; without this, a request that waited for
    a signature could be overtaken by the next one."""

    __slots__ = ("_before", "_sent")

    def __init__(self, before: asyncio.Future[None] | None) -> None:
        self._before = before
        self._sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def sent(self) -> asyncio.Future[None]:
        return self._sent

    async def wait(self) -> None:
        """Until every earlier request of the channel was sent (no suspension when it was)."""
        if self._before is not None and not self._before.done():
            await asyncio.shield(self._before)

    def done(self) -> None:
        """This request was sent or will never be (idempotent): the next one may go once every
        earlier one has too. Called right before the send's own await: the next request's task
        runs only once this one has suspended, after sending."""
        if self._sent.done():
            return
        if self._before is None or self._before.done():
            self._sent.set_result(None)
        else:
            self._before.add_done_callback(lambda _: self.done())


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
    # Calls with the same key have the same inputs (names, datatypes, shapes, byte sizes, placements),
    # outputs and id: the signature checks' verdict on one holds for all (a ``call_templates.CallTemplate``).
    # None: checked each time.
    shape_key: Hashable | None = None
    session: int = 0  # the client's session key, hashed (proto/prefix_keys.session_key): its engine; 0: none


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

    def values(self) -> list[Any]:
        """The elements in C order as Python objects (``bytes`` for BYTES): for readers of a
        few elements per response, without the array."""
        if self.raw is None:
            raise ValueError(f"output '{self.name}' lies in the client's shared memory")
        if self.datatype == "BYTES":
            return split_bytes(self.raw.data, element_count(self.shape))
        return self.raw.view(numpy_dtype(self.datatype)).tolist()


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
        link.on_repository_change = self.models.observe_generation

    def on_orphan(self, response: m.InferResponse) -> None:
        """A reply nobody waits for: free its memory (RouterLink calls this)."""
        self._finish(response)

    async def is_decoupled(self, model: str, version: str) -> bool:
        return (await self.models.get(model, version)).decoupled

    async def infer(self, call: InferCall, *, endpoint: str = "HTTP end point",
                    turn: SendTurn | None = None) -> InferResult:
        """One request, one response; ``endpoint`` names the caller in the refusal of a decoupled model;
        ``turn``: sent after the earlier requests of its stream."""
        received = time.time_ns() if self.link.tracing else 0  # the router decides whether it is sampled
        self.drain.admit()
        sig = await self.models.get(call.model, call.version)
        if sig.decoupled:
            if sig.plain_infer:
                return await self._one_response(call, endpoint, turn)
            raise unsupported(f"{endpoint} doesn't support models with decoupled transaction policy")
        self._admit()
        try:
            request = await self._validated(sig, call)
            if received:
                request.trace = m.TraceContext(received, call.traceparent)
            if turn is not None:
                await turn.wait()
                turn.done()  # link.infer sends before its first suspension
            response = await self.link.infer(request)
        finally:
            self._in_flight -= 1
        return self.finished(response, call)

    def start(self, call: InferCall) -> m.InferRequest | None:
        """``infer``'s steps up to the send, for a caller that sends the request itself
        (``RouterLink.submit``) and hands the answer to ``answered``, when none of them waits:
        a ``call_templates`` call to a model whose signature is cached and that is not decoupled.
        None when one might (nothing done then: ``infer`` does it all); raises what ``infer``
        would raise before sending. Counted in flight until ``answered`` or ``abandoned``."""
        if call.shape_key is None:
            return None
        sig = self.models.cached(call.model, call.version)
        if sig is None or sig.decoupled:
            return None
        received = time.time_ns() if self.link.tracing else 0
        self.drain.admit()
        self._admit()
        try:
            request = self._send_inputs(sig, call)
        except ConveyorError as exc:
            self._in_flight -= 1
            if exc.status in _REFUSALS:
                return None  # perhaps a stale signature: ``infer`` asks the router (a template's checks are pure)
            raise
        except BaseException:
            self._in_flight -= 1
            raise
        if received:
            request.trace = m.TraceContext(received, call.traceparent)
        return request

    def answered(self, response: m.InferResponse, call: InferCall) -> InferResult:
        """The answer to a request ``start`` made: as ``infer`` returns it, or raises."""
        self._in_flight -= 1
        return self.finished(response, call)

    def answered_unread(self, response: m.InferResponse) -> None:
        """``answered`` short of the result (``settled``): the caller reads the outputs from
        ``regions`` and releases them (``release_blocks``), or makes the result (``result``)."""
        self._in_flight -= 1
        self.settled(response)

    def abandoned(self) -> None:
        """A request ``start`` made will not be waited for (``RouterLink.abandon``)."""
        self._in_flight -= 1

    def finished(self, response: m.InferResponse, call: InferCall) -> InferResult:
        """The router's answer to ``call``'s request, which is no longer in flight: its result, or its error raised."""
        self.settled(response)
        return self.result(response, call)

    def settled(self, response: m.InferResponse) -> None:
        """The bookkeeping of the router's (final) answer to a request no longer in flight: its input
        block freed, its trace ended, the repository generation observed; its error raised (its output
        block released then)."""
        self._finish_input(response.id)
        if response.trace_id:
            self.link.trace_end(response.trace_id)
        self.models.observe_generation(response.generation)
        if response.error is not None:
            release_blocks(self.regions, response.release)
            raise error_from(response.error)

    async def _one_response(self, call: InferCall, endpoint: str, turn: SendTurn | None = None) -> InferResult:
        """Plain infer on a decoupled model that answers a request that does not stream with one
        final response (vLLM). A request that streams after all is refused at its first partial
        response, which ends it."""
        async with contextlib.aclosing(self.infer_stream(call, turn)) as responses:
            async for item in responses:
                if isinstance(item, StreamError):
                    raise item.error
                if not item.final:
                    item.release()
                    raise unsupported(f"{endpoint} doesn't support models with decoupled transaction policy "
                                      "when the request streams: set 'stream' to false")
                return item
        raise internal("the model sent no response")  # a worker always sends a final one

    async def infer_stream(self, call: InferCall,
                           turn: SendTurn | None = None) -> AsyncGenerator[InferResult | StreamError, None]:
        """Every response to ``call`` (a decoupled model may send none but the final
        flag: an ``InferResult`` without outputs), the last one ``final``; ``turn`` as for ``infer``."""
        request = await self._stream_request(call, turn)
        try:
            async with contextlib.aclosing(self.link.infer_stream(request)) as responses:
                async for response in responses:
                    yield self._streamed(response, call)
        finally:
            self._in_flight -= 1

    async def infer_stream_batches(self, call: InferCall) -> AsyncGenerator[list[InferResult | StreamError], None]:
        """``infer_stream``, each turn yielding every response that arrived since the last (in order).
        The reader releases each result, those after one it stopped at too."""
        request = await self._stream_request(call, None)
        try:
            async with contextlib.aclosing(self.link.infer_stream_batches(request)) as batches:
                async for batch in batches:
                    yield [self._streamed(response, call) for response in batch]
        finally:
            self._in_flight -= 1

    async def _stream_request(self, call: InferCall, turn: SendTurn | None) -> m.InferRequest:
        """``call`` admitted and checked, its inputs written: counted in flight from here on."""
        self.drain.admit()
        sig = await self.models.get(call.model, call.version)
        self._admit()
        try:
            request = await self._validated(sig, call)
            if turn is not None:
                await turn.wait()
                turn.done()  # the first step of link.infer_stream sends
        except BaseException:
            self._in_flight -= 1
            raise
        return request

    def _streamed(self, response: m.InferResponse, call: InferCall) -> InferResult | StreamError:
        if response.final:
            self._finish_input(response.id)
        self.models.observe_generation(response.generation)
        if response.error is not None:
            release_blocks(self.regions, response.release)
            return StreamError(error_from(response.error), response.final)
        return self.result(response, call)

    def _admit(self) -> None:
        """Count one more request in flight, or refuse it (UNAVAILABLE) past the limit."""
        limit = self.limits.max_inflight
        if limit and self._in_flight >= limit:
            raise too_many_in_flight(limit)
        self._in_flight += 1

    def refused(self, model: str, version: str, exc: ConveyorError) -> None:
        """A request to a model refused here as invalid (INVALID_ARG, or a client's mistake Triton
        calls INTERNAL): the router counts it as a REJECTED failure of that model. Adapters call this
        for what they refuse while parsing; the data plane for what its checks refuse. Nothing on the
        success path."""
        if exc.status in _REFUSALS and model:
            self.link.refused(model, version)

    async def _validated(self, sig: ModelSignature, call: InferCall) -> m.InferRequest:
        """``_send_inputs``, checked against a fresh signature before refusing: after a
        reload the cached one may be stale, and a valid request must not be refused.
        A refusal is counted for the model (``refused``); the success path pays nothing."""
        try:
            return self._send_inputs(sig, call)
        except ConveyorError as exc:
            if exc.status not in _REFUSALS:
                raise
            stale = exc
        try:
            fresh = await self.models.refresh(call.model, call.version)
            if fresh is sig:
                raise stale
            return self._send_inputs(fresh, call)
        except ConveyorError as exc:
            self.refused(call.model, call.version, exc)
            raise

    def _send_inputs(self, sig: ModelSignature, call: InferCall) -> m.InferRequest:
        """Validate ``call``, write its inputs into this process's arena, describe it."""
        key = call.shape_key
        verdict = sig.verdicts.get(key) if key is not None else None
        if verdict is None:
            inputs = check_inputs(sig, call.inputs, self.limits.max_input_elements, call.id)
            outputs = check_outputs(sig, call.outputs, call.id)
            uses_shm = any(inp.shm for inp, _ in inputs) or any(o.region for o in outputs)
            if key is not None:
                remember_verdict(sig, key, inputs, outputs, uses_shm)
        else:
            sizes, specs, uses_shm = verdict
            inputs = list(zip(call.inputs, sizes, strict=True))
            outputs = list(specs)  # the request owns its list: the verdict keeps its own
        block = self.arena.alloc(inputs_nbytes(inputs))
        try:
            # The one copy of these bytes: from the parsed request into shared memory.
            refs = write_inputs(self.arena, block, inputs)
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
        if sig.prefix_placed:
            request.prefix = prefix_key(refs, self.arena.view, call.parameters)
            request.session = call.session
        self._blocks[request.id] = block
        return request

    def result(self, response: m.InferResponse, call: InferCall) -> InferResult:
        """``response``'s outputs as views of shared memory, until ``InferResult.release``."""
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

    # --- input blocks -------------------------------------------------------------------

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
            flags = regions.array(rel.region)
            offset = rel.offset
            if 0 <= offset < flags.shape[0]:
                flags[offset] = RELEASED  # an element, not a view of one: about 1 µs less
            else:
                regions.view(rel.region, offset, 1)  # refused: logged, as any range outside its segment
        except ConveyorError:
            pass  # the worker is gone, and its segment with it
