"""One OpenAI request as one request to a generative model (``contract.py``), and its
responses read back as steps: each choice's new text, finish reason and token counts.

The model gets ``text_input``, ``stream``, ``sampling_parameters`` (JSON; ``n``
choices come back as ``n`` elements of ``text_output``; ``lora_name`` picks the
adapter) or, without that input, one input per sampling field, and
``exclude_input_in_output`` (always true: ``echo`` is written here, so
it streams too), plus the ``return_*`` inputs the model declares, for ``usage`` and
``finish_reason`` (and ``return_logprobs`` when the request asks for logprobs, and
``return_prompt_logprobs`` when it asks for the prompt's: ``echo`` with ``logprobs``); each
only when the model declares it. A prompt of token ids goes in ``input_ids`` (INT32), with an
empty ``text_input``: ``prompts.py``. Streaming or not, the responses are read the same way:
a non-streamed request is one response holding the whole text, and so is the one answer
of a model that is not decoupled (plain infer), streamed request or not.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from conveyor.ingress.dataplane import DataPlane, InferCall, InferResult, StreamError
from conveyor.ingress.openai.catalog import Target
from conveyor.ingress.openai.contract import (
    IDS_INPUT,
    TEXT_INPUT,
    TEXT_OUTPUT,
    api_refused,
    task_refused,
    tensor_inputs,
)
from conveyor.ingress.openai.media import IMAGE_INPUT
from conveyor.ingress.openai.tokenizer import Tokenizer
from conveyor.proto import stream_steps
from conveyor.proto.errors import ConveyorError, WorkerLost, invalid_arg
from conveyor.proto.request_checks import InferInput
from conveyor.proto.signature import ModelSignature

if TYPE_CHECKING:
    from conveyor.ingress.openai.migration import Resume

_RETURNS = ("return_num_input_tokens", "return_num_output_tokens", "return_finish_reason",
            "return_num_cached_tokens")
LOGPROBS_INPUT = "return_logprobs"
# Conveyor's, beside Triton's vLLM contract: the prompt's own logprobs (vLLM's ``prompt_logprobs``) come
# back in the ``prompt_logprobs`` output of the first response when this input is true.
PROMPT_LOGPROBS_INPUT = "return_prompt_logprobs"


@dataclass(slots=True)
class TokenLogprob:
    """One token: its text, its logprob, and the most likely tokens at its place (text, logprob), most
    likely first, as many as the request asked for. ``listed``: the token and the alternatives as the
    engine lists them, the token first, as many as vLLM's completions show (one more than asked: the
    token itself when it is not among the most likely). A prompt's first token has no logprob (None)."""

    token: str
    logprob: float | None
    top: list[tuple[str, float]]
    listed: list[tuple[str, float]] = field(default_factory=list)


@dataclass(slots=True)
class Step:
    """One response of the model: ``texts[i]`` is choice i's new text, ``logprobs[i]`` its new tokens'."""

    texts: list[str]
    finish: list[str | None]
    prompt_tokens: int | None
    output_tokens: int  # new tokens over every choice
    final: bool
    logprobs: list[list[TokenLogprob]] | None = None
    # per choice, its prompt's tokens (with the request's first response only; else None)
    prompt_logprobs: list[list[TokenLogprob] | None] | None = None
    # The choices it speaks for (one prompt's of several), its lists holding only theirs (``texts[0]`` is
    # choice ``span[0]``'s); None: all.
    span: tuple[int, int] | None = None
    cached_tokens: int | None = None  # the prompt's tokens the engine's prefix cache held (None: not reported)
    # per choice, the stop string it finished on, in the step where it finished (None: none, or not reported)
    stops: list[str | None] | None = None


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    counted: bool = False  # the model reports token counts
    cached_tokens: int | None = None

    def add(self, step: Step) -> None:
        if step.prompt_tokens is not None:
            self.prompt_tokens = step.prompt_tokens
            self.counted = True
        if step.cached_tokens is not None:
            self.cached_tokens = step.cached_tokens
        self.completion_tokens += step.output_tokens

    def wire(self) -> dict[str, Any] | None:
        if not self.counted:
            return None
        doc: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                               "total_tokens": self.prompt_tokens + self.completion_tokens}
        if self.cached_tokens is not None:  # as vLLM's server with --enable-prompt-tokens-details (aiperf reads it)
            doc["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return doc


def engine_call(target: Target, prompt: str | list[int], params: dict[str, object], stream: bool,
                request_id: str = "", images: list[bytes] | None = None) -> InferCall:
    """The model's request; ``request_id``: the client's (``X-Request-Id``), the request's id in the
    group's logs and traces, as in every Triton request that carries one. ``prompt``: text, or token ids;
    ``images``: base64 texts, the model's ``image`` input (media.py)."""
    model = target.model
    sig = model.signature
    if target.adapter is not None:
        params = {**params, "lora_name": target.adapter}
    json_params = model.contract.sampling_json
    ids = _ids_input(sig, prompt, model.name) if isinstance(prompt, list) else None
    values: dict[str, object] = {
        TEXT_INPUT: prompt.encode() if isinstance(prompt, str) else b"",
        "stream": stream and model.contract.decoupled,
        "exclude_input_in_output": True,
    }
    if json_params:
        values["sampling_parameters"] = orjson.dumps(params)
    for name in _RETURNS:
        values[name] = True
    if "logprobs" in params:
        if LOGPROBS_INPUT not in sig.inputs:
            raise invalid_arg(f"model '{model.name}' does not return logprobs (no '{LOGPROBS_INPUT}' input)")
        values[LOGPROBS_INPUT] = True
    if "prompt_logprobs" in params:
        if PROMPT_LOGPROBS_INPUT not in sig.inputs:
            raise invalid_arg(f"model '{model.name}' does not return the prompt's logprobs (no "
                              f"'{PROMPT_LOGPROBS_INPUT}' input), which `echo` with `logprobs` shows")
        values[PROMPT_LOGPROBS_INPUT] = True
    inputs = [scalar_input(sig, name, value) for name, value in values.items() if name in sig.inputs]
    if ids is not None:
        inputs.append(ids)
    if images:
        inputs.append(_images_input(sig, images, model.name))
    if not json_params:
        inputs += tensor_inputs(sig, {k: v for k, v in params.items() if k != "logprobs"} if "logprobs" in params
                                else params, model.name)
    call = InferCall(model=model.name, version="", inputs=inputs, id=request_id)
    if model.steps:
        call.parameters[stream_steps.STEPS] = True
    return call


def _ids_input(sig: ModelSignature, ids: list[int], model: str) -> InferInput:
    spec = sig.inputs.get(IDS_INPUT)
    if spec is None or spec.datatype not in ("INT32", "INT64"):
        raise invalid_arg(f"model '{model}' cannot take a prompt of token ids: it declares no INT32 "
                          f"'{IDS_INPUT}' input")
    data = np.array(ids, dtype=np.int32 if spec.datatype == "INT32" else np.int64)
    shape = ([1] if sig.max_batch_size > 0 else []) + [1] * (len(spec.dims) - 1) + [len(ids)]
    return InferInput(IDS_INPUT, spec.datatype, shape, data)


def _images_input(sig: ModelSignature, images: list[bytes], model: str) -> InferInput:
    spec = sig.inputs.get(IMAGE_INPUT)
    if spec is None or spec.datatype != "BYTES":
        raise invalid_arg(f"model '{model}' does not take images: it declares no BYTES '{IMAGE_INPUT}' input")
    shape = ([1] if sig.max_batch_size > 0 else []) + [1] * (len(spec.dims) - 1) + [len(images)]
    return InferInput(IMAGE_INPUT, "BYTES", shape, np.array(images, dtype=object))


def scalar_input(sig: ModelSignature, name: str, value: object) -> InferInput:
    """One element (BYTES, or BOOL) as the input ``name`` of the model, batched or not, in as many
    dimensions as it declares (``[1, 1]`` unbatched: Triton's TensorRT-LLM-shaped Python models)."""
    spec = sig.inputs[name]
    data = np.array([value], dtype=object if spec.datatype == "BYTES" else bool)
    shape = ([1] if sig.max_batch_size > 0 else []) + [1] * max(len(spec.dims), 1)
    return InferInput(name, spec.datatype, shape, data)


async def steps(dataplane: DataPlane, call: InferCall, n: int, top: int = 0,
                decoupled: bool = True, api: str = "Completions", resume: Resume | None = None,
                join_waiting: bool = False) -> AsyncGenerator[Step, None]:
    """The model's responses as steps. A model error raises (``ConveyorError``); closing
    the iterator early cancels the request, which aborts it in the engine. A model that is
    not decoupled answers once (plain infer): one final step. A model that does not generate (a
    pooling engine) refuses at once: vLLM's words for ``api``, a 400. With ``resume``, a request whose
    worker dies is sent again and its steps go on where they were (``migration.py``).

    With ``join_waiting`` (a vLLM model), the responses that arrived while the reader was busy (the
    client or this loop behind) come as one step, their texts joined (``joined``): every token in
    order, in fewer chunks, as vLLM's own server merges the outputs its reader has not taken yet.
    Without it each response is a step, one chunk each, as Triton's OpenAI frontend streams any model."""
    try:
        if not decoupled:
            yield _step(await dataplane.infer(call, endpoint="The OpenAI endpoint"), n, top)
            return
        moved: InferCall | None = call
        while moved is not None:
            attempt, moved, answered = moved, None, False
            try:
                async with contextlib.aclosing(dataplane.infer_stream_batches(attempt)) as batches:
                    async for batch in batches:
                        found: list[Step] = []
                        error: StreamError | None = None
                        taken = 0
                        try:
                            for item in batch:
                                taken += 1
                                if isinstance(item, StreamError):  # it ends the request: nothing after it is read
                                    error = item
                                    break
                                answered = True
                                step = _step(item, n, top)  # releases the item
                                if resume is not None:
                                    resume.observe(item.parameters)
                                    step = resume.adjust(step)
                                found.append(step)
                        finally:
                            _release(batch, taken)
                        if join_waiting:
                            if found:
                                yield joined(found)
                        else:
                            for step in found:
                                yield step
                        if error is None:
                            continue
                        if resume is None or not isinstance(error.error, WorkerLost):
                            raise error.error
                        moved = resume.moved(error.error)
                        if moved is None:  # every token came but the last response: the answer is whole
                            yield Step([""] * n, ["length"] * n, None, 0, True)
                        break
            except ConveyorError as exc:  # a moved request refused: its model may not be served again yet
                if resume is None or answered or not await resume.wait_back(exc):
                    raise
                moved = resume.again()
    except ConveyorError as exc:
        if task_refused(exc, "generate"):
            raise api_refused(api) from None
        raise


def _release(batch: list[InferResult | StreamError], start: int) -> None:
    for item in batch[start:]:
        if isinstance(item, InferResult):
            item.release()


def joined(found: list[Step]) -> Step:
    """Consecutive steps of one request as one: each choice's texts and logprobs joined in order, its
    finish reason where it finished, the token counts added (the prompt's: the latest reported)."""
    if len(found) == 1:
        return found[0]
    first = found[0]
    out = Step(list(first.texts), list(first.finish), first.prompt_tokens, first.output_tokens, first.final,
               None if first.logprobs is None else [list(tokens) for tokens in first.logprobs],
               first.prompt_logprobs, first.span, first.cached_tokens)
    for step in found[1:]:
        texts = out.texts
        for i, text in enumerate(step.texts):
            if i < len(texts):
                texts[i] += text
            else:
                texts.append(text)
        finish = out.finish
        for i, reason in enumerate(step.finish):
            if i >= len(finish):
                finish.append(reason)
            elif reason is not None:
                finish[i] = reason
        if step.logprobs is not None:
            if out.logprobs is None:
                out.logprobs = [[] for _ in step.logprobs]
            for i, tokens in enumerate(step.logprobs):
                if i < len(out.logprobs):
                    out.logprobs[i] += tokens
                else:
                    out.logprobs.append(list(tokens))
        if out.prompt_logprobs is None:
            out.prompt_logprobs = step.prompt_logprobs
        if step.prompt_tokens is not None:
            out.prompt_tokens = step.prompt_tokens
        if step.cached_tokens is not None:
            out.cached_tokens = step.cached_tokens
        if step.stops is not None:
            if out.stops is None:
                out.stops = list(step.stops)
            else:
                out.stops += [None] * (len(step.stops) - len(out.stops))
                for i, stop in enumerate(step.stops):
                    out.stops[i] = stop or out.stops[i]
        out.output_tokens += step.output_tokens
        out.final = step.final
    return out


async def counted(found: AsyncGenerator[Step, None], tokenizer: Tokenizer, prompt: str | list[int],
                  add_special_tokens: bool) -> AsyncGenerator[Step, None]:
    """The steps of a model that does not count its tokens, counted with its tokenizer: the prompt as
    the tokenizer splits it (token ids: their number); each step's new text on its own, and the last
    step whatever makes the total the whole text's count (pieces split tokens apart, so their counts
    may not add up to it)."""
    parts: list[list[str]] = []
    so_far = 0
    first = True
    try:
        async for step in found:
            if first:
                step.prompt_tokens = (len(prompt) if isinstance(prompt, list)
                                      else tokenizer.count(prompt, add_special_tokens))
                first = False
            parts += [[] for _ in range(len(step.texts) - len(parts))]
            for i, text in enumerate(step.texts):
                parts[i].append(text)
            if step.final:
                step.output_tokens = sum(tokenizer.count("".join(p)) for p in parts) - so_far
            else:
                step.output_tokens = sum(tokenizer.count(t) for t in step.texts)
            so_far += step.output_tokens
            yield step
    finally:
        await found.aclose()


def _step(result: InferResult, n: int, top: int) -> Step:
    try:
        parameters = result.parameters
        if parameters:
            carried = parameters.get(stream_steps.STEP)
            if carried is not None:  # the vLLM backend's answer to STEPS: no tensors
                return _carried(carried, result.final, n, top)
        texts = [""] * n
        finish: list[str | None] = [None] * n
        prompt_tokens: int | None = None
        cached_tokens: int | None = None
        output_tokens = 0
        reasons = False
        logprobs: list[list[TokenLogprob]] | None = None
        prompt_logprobs: list[TokenLogprob] | None = None
        for out in result.outputs:  # a few small outputs per token: read without arrays
            if out.raw is None:
                continue
            name = out.name
            if name == TEXT_OUTPUT:
                texts = [b.decode("utf-8", "replace") for b in out.values()]
            elif name == "finish_reason":
                finish = [_reason(b) for b in out.values()]
                reasons = True
            elif name == "num_input_tokens":
                prompt_tokens = int(out.values()[0])
            elif name == "num_cached_tokens":
                cached_tokens = int(out.values()[0])
            elif name == "num_output_tokens":
                output_tokens = int(sum(out.values()))
            elif name == "logprobs":
                logprobs = [_token_logprobs(raw, top) for raw in out.values()]
            elif name == "prompt_logprobs":
                raw = out.values()[0]
                prompt_logprobs = _token_logprobs(raw, top) if raw not in (b"", b"null") else None
        if result.final and not reasons:
            finish = ["stop"] * n  # a model that does not say why it stopped
        return Step(texts, finish, prompt_tokens, output_tokens, result.final, logprobs,
                    None if prompt_logprobs is None else [prompt_logprobs] * n, cached_tokens=cached_tokens)
    finally:
        result.release()


def _carried(step: list[Any], final: bool, n: int, top: int) -> Step:
    """A step from the response's parameters (``proto/stream_steps.py``), read as ``_step`` reads tensors."""
    finish = step[stream_steps.FINISH]
    if finish is None:
        finish = ["stop"] * n if final else [None] * n
    logprobs = step[stream_steps.LOGPROBS]
    prompt = step[stream_steps.PROMPT_LOGPROBS]
    prompt_logprobs = _token_logprobs(prompt, top) if prompt else None
    return Step(step[stream_steps.TEXTS], finish, step[stream_steps.PROMPT_TOKENS],
                step[stream_steps.OUTPUT_TOKENS] or 0, final,
                None if logprobs is None else [_token_logprobs(raw, top) for raw in logprobs],
                None if prompt_logprobs is None else [prompt_logprobs] * n,
                cached_tokens=step[stream_steps.CACHED_TOKENS],
                # a step of an older backend has no stop strings
                stops=step[stream_steps.STOP_STRINGS] if len(step) > stream_steps.STOP_STRINGS else None)


def _token_logprobs(raw: bytes | str, top: int) -> list[TokenLogprob]:
    """The backend's JSON for one sequence's new tokens (or the prompt's): per token, token id ->
    {logprob, rank, decoded_token}, the chosen token first (vLLM puts it there), then the ``top`` most
    likely; a prompt's first token has a null logprob and no alternatives."""
    steps = orjson.loads(raw)
    if not steps:
        return []
    out = []
    for step in steps:
        entries = list(step.values())
        chosen = entries[0]
        if chosen["logprob"] is None:
            out.append(TokenLogprob(chosen["decoded_token"] or "", None, []))
            continue
        ranked = sorted((e for e in entries if e["rank"] is not None and e["rank"] <= top), key=lambda e: e["rank"])
        out.append(TokenLogprob(chosen["decoded_token"] or "", chosen["logprob"],
                                [(e["decoded_token"] or "", e["logprob"]) for e in ranked],
                                [(e["decoded_token"] or "", e["logprob"]) for e in entries[:top + 1]]))
    return out


def _reason(raw: bytes) -> str | None:
    reason = raw.decode()
    return None if reason in ("None", "") else reason
