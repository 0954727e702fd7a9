"""BLS for Python models: ``pb_utils.InferenceRequest.exec()`` and
``async_exec()`` go through the worker's ``BlsLink`` to the router, so the
callee is queued, batched, counted and placed like any client's request.

Each request is first checked as the ingress checks a client's (the same code,
``proto/request_checks.py``, against the callee's signature): a wrong input
or an unknown model fails only that call, with an error response. Its tensors
are then written once into this worker's arena (the callee reads them in
place); each response's outputs are read from the callee's output block,
copied into numpy arrays for the model, and the block released.

A call is made for the requests the calling thread's ``execute`` serves
(``pb_utils.bls.current_requests``): once they are all cancelled (their
client went away, or its deadline passed) the call sends ``Cancel`` for its
BLS request and returns a CANCELLED error response at once, instead of waiting
for the callee; what the callee still sends is released unread.

A request that sets no ``timeout`` gets ``DEFAULT_QUEUE_TIMEOUT_S`` as its
queue deadline: a model that calls itself on its only instance (or a cycle of
models that fills every instance) would otherwise wait forever for an instance
that waits for it. The deadline bounds the wait in the router's queue only,
never the callee's run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from conveyor.proto import messages as m
from conveyor.proto.datatypes import datatype_of, deserialize_bytes, element_count, numpy_dtype
from conveyor.proto.errors import ConveyorError, Status, triton_code
from conveyor.proto.request_checks import (
    InferInput,
    RequestedOutput,
    check_inputs,
    check_outputs,
    inputs_nbytes,
    write_inputs,
)
from conveyor.proto.signature import ModelSignature
from conveyor.shm.regions import RegionCache
from conveyor.workers.backends.python.bls_answers import CANCELLED, Answers, AsyncAnswers, CancelWatch
from conveyor.workers.backends.python.pb_utils import InferenceRequest, InferenceResponse, Tensor, TritonError
from conveyor.workers.backends.python.pb_utils.inference import bls_parameters
from conveyor.workers.bls_link import BlsLink
from conveyor.workers.bls_signatures import BlsSignatures
from conveyor.workers.inline_switch import InlineSwitch

DEFAULT_QUEUE_TIMEOUT_S = 60.0
CheckedInputs = list[tuple[InferInput, int]]
_FOR_CANCELLED = "as the request it was made for was cancelled"


class BlsClient:
    """Implements ``pb_utils.bls.BlsExecutor`` over a ``BlsLink``."""

    def __init__(self, link: BlsLink, regions: RegionCache) -> None:
        self.link = link
        self.regions = regions
        self.signatures = BlsSignatures(link)

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        answers = Answers(self._release)
        call = _Call(self, request, answers, stream=False)
        try:
            response = call.settled
            while response is None:
                response = call.take(answers.get())
            return response
        finally:
            call.close()

    async def infer_async(self, request: InferenceRequest) -> InferenceResponse:
        answers = AsyncAnswers(self._release)
        call = _Call(self, request, answers, stream=False)
        try:
            response = call.settled
            try:
                while response is None:
                    response = call.take(await answers.get())
            except asyncio.CancelledError:  # the model stopped waiting (e.g. asyncio.wait_for)
                call.abandon()
                raise
            return response
        finally:
            call.close()

    def stream(self, request: InferenceRequest) -> ResponseIterator:
        """Every response of a decoupled callee as it comes, the final one last
        (without outputs when the callee sent only the final flag)."""
        return ResponseIterator(self, request)

    async def stream_async(self, request: InferenceRequest) -> ResponseIterator:
        """``async_exec(decoupled=True)``: the iterator once the first response is in, waited for
        off the event loop (on its default executor), so other coroutines of the model run
        meanwhile, as in Triton."""
        iterator = ResponseIterator(self, request)
        await asyncio.get_running_loop().run_in_executor(None, iterator.prefetch)
        return iterator

    def model_ready(self, model: str, version: str) -> bool:
        InlineSwitch.refuse_on_main_thread("model-management call")
        return self.link.model_ready(model, version)

    def repository_load(self, model: str, config: str, files: dict[str, bytes] | None) -> None:
        InlineSwitch.refuse_on_main_thread("model-management call")
        self.link.repository_load(model, config, files)

    def repository_unload(self, model: str, unload_dependents: bool) -> None:
        InlineSwitch.refuse_on_main_thread("model-management call")
        self.link.repository_unload(model, unload_dependents)

    # --- descriptors ---------------------------------------------------------------------

    def _send(self, request: InferenceRequest, on_response: Callable[[m.InferResponse], None]) -> int:
        """Check ``request`` against the callee's signature, write its inputs, send it.

        Raises ``ConveyorError`` (nothing sent) when the request is wrong."""
        InlineSwitch.refuse_on_main_thread("BLS call")  # its answer would need the loop it blocks
        version = request.model_version()
        label = "" if version < 0 else str(version)
        model = request.model_name()
        try:
            built = self._build(request, self.signatures.get(model, label))
        except ConveyorError as exc:
            if exc.status is not Status.INVALID_ARG:
                raise
            fresh = self.signatures.refresh(model, label)  # the model may have been reloaded since
            if fresh is None:
                raise
            built = self._build(request, fresh)
        inputs, outputs = built
        nbytes = inputs_nbytes(inputs)
        block = self.link.alloc(nbytes) if nbytes else None
        refs = write_inputs(self.link.arena, block or 0, inputs)
        timeout_us = request.timeout()
        wait_ns = timeout_us * 1000 if timeout_us > 0 else int(DEFAULT_QUEUE_TIMEOUT_S * 1e9)
        rid = self.link.next_id()
        self.link.submit(
            m.InferRequest(
                rid, model, label, refs, outputs, parameters=bls_parameters(request),
                deadline_ns=time.monotonic_ns() + wait_ns, request_id=request.request_id(),
            ),
            block, on_response,
        )
        return rid

    @staticmethod
    def _build(request: InferenceRequest, sig: ModelSignature) -> tuple[CheckedInputs, list[m.OutputSpec]]:
        inputs: list[InferInput] = []
        for tensor in request.inputs():
            array = tensor.host_array()  # BLS inputs travel in host shared memory
            inputs.append(InferInput(tensor.name(), datatype_of(array), list(array.shape), array))
        names = request.requested_output_names()
        rid = request.request_id()
        outputs = check_outputs(sig, [RequestedOutput(name) for name in names] if names else None, rid)
        return check_inputs(sig, inputs, request_id=rid), outputs

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
            return InferenceResponse(error=TritonError(msg.error.message, triton_code(msg.error.status)))
        try:
            return InferenceResponse(
                [Tensor(ref.name, self._array(ref)) for ref in msg.outputs],
                parameters=msg.parameters or None,
            )
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


class _Call:
    """One BLS call's course, from its send to its last response, that the blocking
    (``infer``), awaited (``infer_async``) and iterated (``ResponseIterator``) front ends
    share: each waits for the next answer its own way and hands it to ``take``.

    The call is sent when made, unless the requests it is made for are cancelled already
    or the request is wrong: then ``settled`` is its only response and nothing is sent.
    ``stream``: every response is handed out as it comes (``exec(decoupled=True)``);
    otherwise the final one is the call's one response, and a callee that streams more
    than one is refused as decoupled."""

    def __init__(self, client: BlsClient, request: InferenceRequest, answers: Answers | AsyncAnswers,
                 *, stream: bool) -> None:
        self.client = client
        self.request = request
        self.answers = answers
        self.stream = stream
        self.rid = 0  # 0: nothing of ours the router still runs
        self.finished = False  # the last response was handed out (or is being)
        self.settled: InferenceResponse | None = None
        self._streamed: list[m.InferResponse] = []  # non-final responses held back (not ``stream``)
        self._watch = CancelWatch.for_caller(lambda: answers.put(CANCELLED))
        if self._watch is not None and self._watch.fired:
            self.settled = _cancelled(request, _FOR_CANCELLED)
            return
        try:
            self.rid = client._send(request, answers.put)
        except ConveyorError as exc:
            self.settled = _error_response(exc)
        except BaseException:
            self.close()  # no front end holds the call yet to close its watch
            raise

    def take(self, msg: m.InferResponse) -> InferenceResponse | None:
        """The response ``msg`` gives the model; None when it gives none yet (a held
        non-final response). ``finished`` is set before the response is read, so a read
        that fails still ends the call."""
        if msg is CANCELLED:
            self.finished = True
            self.abandon()
            return _cancelled(self.request, _FOR_CANCELLED)
        if msg.final:
            self.finished = True
            if not self.stream:
                return self.client._one(self.request, self._streamed, msg)
        elif not self.stream:
            self._streamed.append(msg)
            return None
        return self.client._response(msg)

    def abandon(self) -> None:
        """Stop waiting: tell the router, release what came and what still comes."""
        if self.rid:
            self.client.link.cancel(self.rid, self.client._release)
            self.rid = 0
        self.answers.abandon()
        for msg in self._streamed:
            self.client._release(msg)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()


class ResponseIterator:
    """``exec(decoupled=True)``: the callee's responses as they come, the final one
    last. ``cancel()`` (Triton's) asks the callee to stop, and the iteration goes on
    with what the callee still sends, as in Triton: a callee that honours it ends with
    its CANCELLED error (one still queued is answered CANCELLED by the router), one
    that ignores it answers on. When the requests the call was made for are
    cancelled, the iteration ends at once with a CANCELLED error response. The request
    is sent when the iterator is made."""

    def __init__(self, client: BlsClient, request: InferenceRequest) -> None:
        self._done = False
        self._first: m.InferResponse | None = None  # prefetch()ed, not yet iterated
        self._answers = Answers(client._release)
        self._call = _Call(client, request, self._answers, stream=True)

    def __iter__(self) -> Iterator[InferenceResponse]:
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            raise StopIteration
        response = self._call.settled
        if response is not None:
            self._finish()
            return response
        msg = self._first if self._first is not None else self._answers.get()
        self._first = None
        try:
            taken = self._call.take(msg)
        finally:
            if self._call.finished:
                self._finish()
        assert taken is not None  # a streaming call hands out every response
        return taken

    def prefetch(self) -> None:
        """Wait for the first answer, which the iteration then starts with."""
        if not self._done and self._call.settled is None and self._first is None:
            self._first = self._answers.get()

    def cancel(self) -> None:
        """Ask the callee to stop (its ``is_cancelled()`` turns true); keep iterating for
        the rest of what it sends."""
        if not self._done and self._call.rid:
            self._call.client.link.request_cancel(self._call.rid)

    def _finish(self) -> None:
        self._done = True
        self._call.close()

    def __del__(self) -> None:
        if not self._done:  # dropped before its final response: stop the callee
            try:
                self._call.abandon()
                self._finish()
            except Exception:
                pass  # interpreter shutdown, or a call that failed to be made


def _cancelled(request: InferenceRequest, why: str) -> InferenceResponse:
    return InferenceResponse(error=TritonError(
        f"BLS request to model '{request.model_name()}' cancelled {why}", TritonError.CANCELLED,
    ))


def _error_response(exc: ConveyorError) -> InferenceResponse:
    return InferenceResponse(error=TritonError(exc.message, triton_code(exc.status)))
