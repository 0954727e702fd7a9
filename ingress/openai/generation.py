"""One OpenAI request as one request to a generative model (``contract.py``), and its
responses read back as steps: each choice's new text, finish reason and token counts.

The model gets ``text_input``, ``stream``, ``sampling_parameters`` (JSON; ``n``
choices come back as ``n`` elements of ``text_output``; ``lora_name`` picks the
adapter) or, without that input, one input per sampling field, and
``exclude_input_in_output`` (always true: ``echo`` is written here, so
it streams too), plus the ``return_*`` inputs the model declares, for ``usage`` and
``finish_reason`` (and ``return_logprobs`` when the request asks for logprobs); each
only when the model declares it. Streaming or not, the responses are read the same way:
a non-streamed request is one response holding the whole text, and so is the one answer
of a model that is not decoupled (plain infer), streamed request or not.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import numpy as np
import orjson

from conveyor.ingress.dataplane import DataPlane, InferCall, InferResult, StreamError
from conveyor.ingress.openai.catalog import Target
from conveyor.ingress.openai.contract import TEXT_INPUT, TEXT_OUTPUT, api_refused, task_refused, tensor_inputs
from conveyor.ingress.openai.tokenizer import Tokenizer
from conveyor.ingress.request_checks import InferInput
from conveyor.ingress.signature import ModelSignature
from conveyor.proto.errors import ConveyorError, invalid_arg

_RETURNS = ("return_num_input_tokens", "return_num_output_tokens", "return_finish_reason")
LOGPROBS_INPUT = "return_logprobs"


@dataclass(slots=True)
class TokenLogprob:
    """One generated token: its text, its logprob, and the most likely tokens at its place
    (text, logprob), most likely first, as many as the request asked for."""

    token: str
    logprob: float
    top: list[tuple[str, float]]


@dataclass(slots=True)
class Step:
    """One response of the model: ``texts[i]`` is choice i's new text, ``logprobs[i]`` its new tokens'."""

    texts: list[str]
    finish: list[str | None]
    prompt_tokens: int | None
    output_tokens: int  # new tokens over every choice
    final: bool
    logprobs: list[list[TokenLogprob]] | None = None


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    counted: bool = False  # the model reports token counts

    def add(self, step: Step) -> None:
        if step.prompt_tokens is not None:
            self.prompt_tokens = step.prompt_tokens
            self.counted = True
        self.completion_tokens += step.output_tokens

    def wire(self) -> dict[str, int] | None:
        if not self.counted:
            return None
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def engine_call(target: Target, prompt: str, params: dict[str, object], stream: bool,
                request_id: str = "") -> InferCall:
    """The model's request; ``request_id``: the client's (``X-Request-Id``), the request's id in the
    group's logs and traces, as in every Triton request that carries one."""
    model = target.model
    sig = model.signature
    if target.adapter is not None:
        params = {**params, "lora_name": target.adapter}
    json_params = model.contract.sampling_json
    values: dict[str, object] = {
        TEXT_INPUT: prompt.encode(),
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
    inputs = [scalar_input(sig, name, value) for name, value in values.items() if name in sig.inputs]
    if not json_params:
        inputs += tensor_inputs(sig, {k: v for k, v in params.items() if k != "logprobs"} if "logprobs" in params
                                else params, model.name)
    return InferCall(model=model.name, version="", inputs=inputs, id=request_id)


def scalar_input(sig: ModelSignature, name: str, value: object) -> InferInput:
    """One element (BYTES, or BOOL) as the input ``name`` of the model, batched or not."""
    spec = sig.inputs[name]
    data = np.array([value], dtype=object if spec.datatype == "BYTES" else bool)
    shape = [1, 1] if sig.max_batch_size > 0 else [1]
    return InferInput(name, spec.datatype, shape, data)


async def steps(dataplane: DataPlane, call: InferCall, n: int, top: int = 0,
                decoupled: bool = True, api: str = "Completions") -> AsyncGenerator[Step, None]:
    """The model's responses as steps. A model error raises (``ConveyorError``); closing
    the iterator early cancels the request, which aborts it in the engine. A model that is
    not decoupled answers once (plain infer): one final step. A model that does not generate (a
    pooling engine) refuses at once: vLLM's words for ``api``, a 400."""
    try:
        if not decoupled:
            yield _step(await dataplane.infer(call, endpoint="The OpenAI endpoint"), n, top)
            return
        async with contextlib.aclosing(dataplane.infer_stream(call)) as responses:
            async for item in responses:
                if isinstance(item, StreamError):
                    raise item.error
                yield _step(item, n, top)
    except ConveyorError as exc:
        if task_refused(exc, "generate"):
            raise api_refused(api) from None
        raise


async def counted(found: AsyncGenerator[Step, None], tokenizer: Tokenizer, prompt: str,
                  add_special_tokens: bool) -> AsyncGenerator[Step, None]:
    """The steps of a model that does not count its tokens, counted with its tokenizer: the prompt as
    the tokenizer splits it; each step's new text on its own, and the last step whatever makes the
    total the whole text's count (pieces split tokens apart, so their counts may not add up to it)."""
    parts: list[list[str]] = []
    so_far = 0
    first = True
    try:
        async for step in found:
            if first:
                step.prompt_tokens = tokenizer.count(prompt, add_special_tokens)
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
        texts = [""] * n
        finish: list[str | None] = [None] * n
        prompt_tokens: int | None = None
        output_tokens = 0
        reasons = False
        logprobs: list[list[TokenLogprob]] | None = None
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
            elif name == "num_output_tokens":
                output_tokens = int(sum(out.values()))
            elif name == "logprobs":
                logprobs = [_token_logprobs(raw, top) for raw in out.values()]
        if result.final and not reasons:
            finish = ["stop"] * n  # a model that does not say why it stopped
        return Step(texts, finish, prompt_tokens, output_tokens, result.final, logprobs)
    finally:
        result.release()


def _token_logprobs(raw: bytes, top: int) -> list[TokenLogprob]:
    """The backend's JSON for one sequence's new tokens: per token, token id -> {logprob, rank,
    decoded_token}, the chosen token first (vLLM puts it there), then the ``top`` most likely."""
    steps = orjson.loads(raw)
    if not steps:
        return []
    out = []
    for step in steps:
        entries = list(step.values())
        chosen = entries[0]
        ranked = sorted((e for e in entries if e["rank"] is not None and e["rank"] <= top), key=lambda e: e["rank"])
        out.append(TokenLogprob(chosen["decoded_token"] or "", chosen["logprob"],
                                [(e["decoded_token"] or "", e["logprob"]) for e in ranked]))
    return out


def _reason(raw: bytes) -> str | None:
    reason = raw.decode()
    return None if reason in ("None", "") else reason
