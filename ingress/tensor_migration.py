"""A request of Triton's own vLLM contract that survives the death of the worker running it (docs/LLM.md,
"A stream that survives its worker"): ``POST .../generate`` and ``.../generate_stream`` on the HTTP
ingress, ``ModelStreamInfer`` on the gRPC one. When and how a request moves is ``migration.py``'s; here,
how such a request is read and sent again from its tensors, and its responses read on across the move.

The request: ``text_input`` (or ``input_ids``, token ids), ``stream``, and its sampling parameters as
the vLLM backend reads them: the ``sampling_parameters`` input (JSON), or without it the request's
parameters. A resumed request is the same tensors with ``input_ids`` the prompt's ids and those generated
so far (``text_input`` empty: the backend then ignores it), and ``max_tokens`` / ``min_tokens`` less what
was generated where the sampling parameters were. A request whose inputs lie in the client's shared
memory is not read here, and does not move.

The responses of a stream hold what is new since the previous one and never the prompt (the backend
excludes it when streaming), so the resumed engine's ``text_output`` goes on where the first one's
stopped. The counts of the resumed engine's responses are the client's request's: ``num_input_tokens``
and ``num_cached_tokens`` the first engine's (the resumed prompt holds the generated tokens too), and
``cumulative_logprob`` adds what the first engine's had summed; ``prompt_logprobs``, which came with the
first response, is not asked for again (``null``, as an uninterrupted stream's later responses).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import struct
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np

from conveyor.ingress.dataplane import DataPlane, InferCall, InferResult, SendTurn, StreamError
from conveyor.ingress.migration import Migration
from conveyor.proto.datatypes import deserialize_bytes, element_count, numpy_dtype
from conveyor.proto.errors import ConveyorError, WorkerLost
from conveyor.proto.request_checks import InferInput
from conveyor.proto.signature import ModelSignature

TEXT, IDS, SAMPLING, STREAM = "text_input", "input_ids", "sampling_parameters", "stream"
# Request parameters that are the backend's inputs or Conveyor's marks, not sampling parameters (the
# backend's ``_NOT_SAMPLING``, workers/backends/vllm/request.py).
_NOT_SAMPLING = frozenset(("stream", "exclude_input_in_output"))
_NOT_SAMPLING_PREFIXES = ("return_", "conveyor_")


def _values(inp: InferInput) -> list[Any] | None:
    """An input's elements, flat (BYTES as bytes); None when they lie in the client's shared memory."""
    data = inp.data
    if data is None:
        return None
    if isinstance(data, np.ndarray):
        return list(data.reshape(-1))
    if inp.datatype == "BYTES":
        return list(deserialize_bytes(memoryview(data), element_count(inp.shape)))
    return list(np.frombuffer(data, dtype=numpy_dtype(inp.datatype)))


def _sampling(call: InferCall, inputs: dict[str, InferInput]) -> tuple[dict[str, Any], bool] | None:
    """The request's sampling parameters, and whether they came as the ``sampling_parameters`` input;
    None when they cannot be read (the backend refuses such a request anyway)."""
    found = inputs.get(SAMPLING)
    if found is None:
        return {k: v for k, v in call.parameters.items()
                if k not in _NOT_SAMPLING and not k.startswith(_NOT_SAMPLING_PREFIXES)}, False
    values = _values(found)
    if not values:
        return None
    raw = values[0]
    try:
        doc = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
    except (ValueError, RecursionError):  # nested too deeply for json: the backend refuses it
        return None
    return (doc, True) if isinstance(doc, dict) else None


def plan(call: InferCall, sig: ModelSignature) -> TensorMigration | None:
    """``call``'s record for sending it again if its worker dies, marked for its token ids; None when it
    does not move (``MAX_MIGRATIONS`` 0, not a vLLM model, inputs that cannot be read here)."""
    if sig.max_migrations <= 0 or not sig.decoupled or IDS not in sig.inputs:
        return None
    inputs = {inp.name: inp for inp in call.inputs}
    if any(inp.data is None for inp in inputs.values()):
        return None
    sampling = _sampling(call, inputs)
    if sampling is None:
        return None
    stream = inputs.get(STREAM)
    values = None if stream is None else _values(stream)
    resume = TensorMigration(call, sig, sampling[0], bool(values and values[0]), sampling[1])
    call.parameters.update(resume.marks())
    resume.session = call.session
    return resume


class TensorMigration(Migration):
    """One request of Triton's contract: how it is sent again, and its responses' counts as the client's."""

    __slots__ = ("cached_tokens", "cumulative", "in_input", "inputs", "offset", "original", "prompt_tokens", "sig")

    def __init__(self, call: InferCall, sig: ModelSignature, params: dict[str, Any], stream: bool,
                 in_input: bool) -> None:
        super().__init__(call.model, call.id, params, stream, sig.max_migrations)
        self.original = call
        # Copies: the data plane replaces a BYTES input's array with its wire form as it sends the call.
        self.inputs = [dataclasses.replace(inp) for inp in call.inputs]
        self.sig = sig
        self.in_input = in_input  # the sampling parameters are the ``sampling_parameters`` input's
        self.prompt_tokens: int | None = None  # as the first engine reported them
        self.cached_tokens: int | None = None
        self.cumulative: float | None = None  # the latest cumulative_logprob the client got
        self.offset = 0.0  # what the engines before the one answering now summed

    def call(self, prompt_ids: list[int] | None, params: dict[str, Any]) -> InferCall:
        first = self.original
        parameters = {k: v for k, v in first.parameters.items() if not k.startswith("conveyor_")}
        if prompt_ids is None:
            return InferCall(first.model, first.version, [dataclasses.replace(inp) for inp in self.inputs],
                             first.outputs, first.id, parameters, first.timeout_s, first.traceparent, first.shape_key)
        self.offset = self.cumulative or 0.0
        batched = self.sig.max_batch_size > 0
        inputs = [dataclasses.replace(inp) for inp in self.inputs if inp.name not in (TEXT, IDS, SAMPLING)]
        inputs.append(_input(TEXT, "BYTES", np.array([b""], dtype=object), batched))
        spec = self.sig.inputs[IDS]
        dtype = np.int64 if spec.datatype == "INT64" else np.int32
        inputs.append(_input(IDS, spec.datatype, np.array(prompt_ids, dtype=dtype), batched))
        if self.in_input:
            text = json.dumps(params).encode("utf-8")
            inputs.append(_input(SAMPLING, "BYTES", np.array([text], dtype=object), batched))
        else:
            parameters.pop("prompt_logprobs", None)
            parameters.update({k: params[k] for k in ("max_tokens", "min_tokens") if k in params})
        return InferCall(first.model, first.version, inputs, first.outputs, first.id, parameters,
                         first.timeout_s, first.traceparent)

    def adjust(self, result: InferResult) -> None:
        """A response as the client's request's: its counts rewritten where a resumed engine answered."""
        resumed = self.resumed
        for out in result.outputs:
            if out.raw is None:
                continue
            if out.name == "num_input_tokens":
                if resumed and self.prompt_tokens is not None:
                    out.raw = _raw(struct.pack("<I", self.prompt_tokens))
                elif not resumed:
                    self.prompt_tokens = int(out.as_array().reshape(-1)[0])
            elif out.name == "num_cached_tokens" and out.datatype == "UINT32":
                if resumed and self.cached_tokens is not None:
                    out.raw = _raw(struct.pack("<I", self.cached_tokens))
                elif not resumed:
                    self.cached_tokens = int(out.as_array().reshape(-1)[0])
            elif out.name == "cumulative_logprob" and out.datatype == "FP32":
                values = out.as_array().astype(np.float32)
                if resumed:
                    values = values + np.float32(self.offset)
                    out.raw = _raw(values.tobytes())
                if values.size:
                    self.cumulative = float(values.reshape(-1)[0])


def _input(name: str, datatype: str, data: np.ndarray, batched: bool) -> InferInput:
    return InferInput(name, datatype, [1, data.size] if batched else [data.size], data)


def _raw(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


async def resumed_stream(dataplane: DataPlane, call: InferCall, resume: TensorMigration,
                         turn: SendTurn | None = None) -> AsyncGenerator[InferResult | StreamError, None]:
    """``dataplane.infer_stream(call, turn)``, but a request whose worker dies is sent again (``resume``)
    and its responses go on as one stream. One that cannot move ends with the worker's error and why
    (a final ``StreamError``). A moved request refused before it answered waits for its model to serve
    again (``Migration.wait_back``)."""
    attempt: InferCall | None = call
    while attempt is not None:
        current, attempt, answered = attempt, None, False
        try:
            async with contextlib.aclosing(dataplane.infer_stream(current, turn)) as events:
                turn = None  # sent after the stream's earlier requests once: a move goes at once
                async for item in events:
                    if isinstance(item, InferResult):
                        answered = True
                        resume.observe(item.parameters)
                        resume.adjust(item)
                        yield item
                        continue
                    if item.final and isinstance(item.error, WorkerLost):
                        try:
                            attempt = resume.moved(item.error)
                        except WorkerLost as exc:
                            yield StreamError(exc, True)
                            return
                        break
                    if item.final and not answered and await resume.wait_back(item.error):
                        attempt = resume.again()  # a moved request refused: its model is not served again yet
                        break
                    yield item
        except ConveyorError as exc:  # refused before it was sent
            if answered or not await resume.wait_back(exc):
                raise
            attempt = resume.again()
