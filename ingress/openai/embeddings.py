"""``POST /v1/embeddings``, in OpenAI's and vLLM's shapes, for a model whose engine pools (vLLM
with ``"runner": "pooling"`` in its ``model.json``).

The body: ``model``, ``input`` (a string, a list of strings, a list of token ids, or a list of
such lists), ``encoding_format`` (``float``, or ``base64``: the float32 values' bytes, in the
host's order as vLLM writes them unless vLLM's ``endianness`` says otherwise), ``dimensions`` (a
Matryoshka model's shorter vector; the engine checks it and refuses in vLLM's words), vLLM's
``use_activation`` (false: the vector as pooled, not normalized); ``user`` is accepted and ignored.

Each prompt is one request to the model on Triton's vllm_backend contract: ``text_input`` empty
(the config requires it) and ``embedding_request``, the JSON object Triton's OpenAI frontend sends
(``{"input": ..., "pooling_params": {"dimensions": [d]}}``); the model answers the vector as JSON in
``text_output`` and its prompt's length in ``num_input_tokens`` (``workers/backends/vllm/embedding.py``).
A list's prompts run concurrently, as vLLM's server runs them, and come back in order, each with its
``index``; the first failure cancels the others. A model without that input, or one whose engine
does not pool (its refusal: ``contract.task_refused``), is a 400 in vLLM's words.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import sys
import time
from dataclasses import dataclass
from typing import Any

import falcon
import falcon.asgi
import numpy as np
import orjson

from conveyor.ingress.dataplane import DataPlane, InferCall, InferResult, StreamError
from conveyor.ingress.http.body import read_body
from conveyor.ingress.openai.catalog import Catalog, LlmModel
from conveyor.ingress.openai.contract import EMBEDDING_INPUT, TEXT_INPUT, TEXT_OUTPUT, api_refused, task_refused
from conveyor.ingress.openai.forms import OPENAI, TRITON
from conveyor.ingress.openai.generation import scalar_input
from conveyor.ingress.openai.prompts import read_prompts
from conveyor.ingress.openai.request_id import request_id
from conveyor.ingress.openai.schema import EmbeddingRequest
from conveyor.ingress.openai.triton_schema import decoder, schema_first
from conveyor.proto.errors import ConveyorError, internal, invalid_arg

API = "Embeddings"
# OpenAI's limit on the inputs of one embeddings request: each is an engine request of its own, all in flight
# at once (a pooling request: one pass, no decoding, so more than a completion's VLLM_MAX_COMPLETION_PROMPTS).
MAX_INPUTS = 2048
_RETURNS = ("return_num_input_tokens", "return_num_output_tokens")
_ORDER = {"native": "<" if sys.byteorder == "little" else ">", "little": "<", "big": ">"}


@dataclass(slots=True)
class Embedded:
    vector: np.ndarray  # float32
    prompt_tokens: int


def prompts(value: str | list[Any]) -> list[str | list[int]]:
    """The request's prompts: one string, strings, one prompt's token ids, or several prompts' ids."""
    return read_prompts(value, "input", MAX_INPUTS)


def encoder(request: EmbeddingRequest) -> str:
    """The numpy dtype the vectors are written in: float32 in the asked byte order."""
    if request.encoding_format not in ("float", "base64"):
        raise invalid_arg(f"`encoding_format` '{request.encoding_format}' is not supported: 'float' or 'base64'")
    if request.embed_dtype != "float32":
        raise invalid_arg(f"`embed_dtype` '{request.embed_dtype}' is not supported: 'float32'")
    order = _ORDER.get(request.endianness)
    if order is None:
        raise invalid_arg(f"`endianness` '{request.endianness}' is not one of {', '.join(_ORDER)}")
    return order + "f4"


def embed_call(model: LlmModel, prompt: str | list[int], pooling: dict[str, Any], rid: str) -> InferCall:
    """One prompt's request, on Triton's contract (``embedding_request``)."""
    sig = model.signature
    values: dict[str, object] = {
        TEXT_INPUT: b"",
        EMBEDDING_INPUT: orjson.dumps({"input": prompt, "pooling_params": pooling}),
        **dict.fromkeys(_RETURNS, True),
    }
    inputs = [scalar_input(sig, name, value) for name, value in values.items() if name in sig.inputs]
    return InferCall(model=model.name, version="", inputs=inputs, id=rid)


def read_answer(result: InferResult) -> Embedded:
    try:
        vector: list[float] | None = None
        tokens = 0
        for out in result.outputs:
            if out.raw is None:
                continue
            if out.name == TEXT_OUTPUT:
                vector = orjson.loads(out.values()[0])
            elif out.name == "num_input_tokens":
                tokens = int(out.values()[0])
        if not isinstance(vector, list):
            raise internal(f"the model's answer holds no embedding (a JSON array in '{TEXT_OUTPUT}')")
        return Embedded(np.asarray(vector, dtype=np.float32), tokens)
    finally:
        result.release()


class Embeddings:
    def __init__(self, dataplane: DataPlane, catalog: Catalog, max_body_bytes: int, max_json_bytes: int = 0,
                 error_form: str = OPENAI) -> None:
        self._dataplane = dataplane
        self._catalog = catalog
        self._max_body_bytes = max_body_bytes
        self._max_json_bytes = max_json_bytes
        self._decode = decoder(error_form)  # --openai-error-form triton: within Triton's schema too
        self._triton = error_form == TRITON

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await read_body(req, resp, self._max_body_bytes, self._max_json_bytes)
        self._dataplane.drain.admit()
        try:
            request, dtype, texts, model = await self._read(body)
        except ConveyorError as exc:
            refusal = schema_first(exc, EmbeddingRequest, body) if self._triton else exc
            if refusal is exc:
                raise
            raise refusal from None  # Triton's frontend validates the body with its schema before anything else
        pooling: dict[str, Any] = {}
        if request.dimensions is not None:
            pooling["dimensions"] = [request.dimensions]  # Triton's frontend's form
        if request.use_activation is not None:
            pooling["use_activation"] = request.use_activation
        rid = request_id(req, request.request_id)
        calls = [embed_call(model, p, pooling, f"{rid}-{i}" if len(texts) > 1 else rid) for i, p in enumerate(texts)]
        try:
            done = await self._all(model, calls)
        except ConveyorError as exc:
            if task_refused(exc, "embed"):
                raise api_refused(API) from None
            raise
        data = [{"index": i, "object": "embedding", "embedding": _encoded(e.vector, request.encoding_format, dtype)}
                for i, e in enumerate(done)]
        tokens = sum(e.prompt_tokens for e in done)
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps({
            "id": f"embd-{rid}", "object": "list", "created": int(time.time()), "model": request.model,
            "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }, option=orjson.OPT_SERIALIZE_NUMPY)

    async def _read(self, body: bytes) -> tuple[EmbeddingRequest, str, list[str | list[int]], LlmModel]:
        """The request, the dtype its vectors are written in, its prompts and its model."""
        request = self._decode(body, EmbeddingRequest)
        dtype = encoder(request)
        texts = prompts(request.input)
        target = await self._catalog.target(request.model)
        if target.adapter is not None:
            raise invalid_arg(f"`{request.model}` names a LoRA adapter: embeddings are served by base models only")
        spec = target.model.signature.inputs.get(EMBEDDING_INPUT)
        if spec is None or spec.datatype != "BYTES":
            raise api_refused(API)
        return request, dtype, texts, target.model

    async def _all(self, model: LlmModel, calls: list[InferCall]) -> list[Embedded]:
        """Every prompt's vector, in order; the first failure (by index) raises, once the others are
        cancelled: their requests end in the engine too."""
        tasks = [asyncio.ensure_future(self._embed(model, call)) for call in calls]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in tasks:
                task.cancel()  # nothing to a finished one
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return [task.result() for task in tasks]

    async def _embed(self, model: LlmModel, call: InferCall) -> Embedded:
        if not model.contract.decoupled:
            return read_answer(await self._dataplane.infer(call, endpoint="The OpenAI endpoint"))
        found: Embedded | None = None
        async with contextlib.aclosing(self._dataplane.infer_stream(call)) as responses:
            async for item in responses:
                if isinstance(item, StreamError):
                    raise item.error
                if item.outputs and found is None:
                    found = read_answer(item)
                else:
                    item.release()  # the final flag alone
        if found is None:
            raise internal("the model answered the embedding request without an embedding")
        return found


def _encoded(vector: np.ndarray, encoding: str, dtype: str) -> np.ndarray | str:
    """As vLLM writes it: the float32 values (orjson writes each as float32's shortest text), or
    their bytes in base64."""
    if encoding == "base64":
        return base64.b64encode(vector.astype(dtype, copy=False).tobytes()).decode("ascii")
    return vector
