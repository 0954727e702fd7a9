"""The request bodies of ``/v1/completions`` and ``/v1/chat/completions``, decoded and
type-checked in one pass (msgspec), and the sampling parameters they carry.

Fields the OpenAI API defines but this ingress cannot honour (``logit_bias``,
``suffix``, tools, ``logprobs`` with ``echo``) are refused with a 400 rather than ignored;
unknown fields are ignored, as OpenAI's own server does. vLLM's extensions to the
API (``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos``, ``min_tokens``,
``structured_outputs``, ``stream_options.continuous_usage_stats``: the usage so far on every
chunk) pass through, as vLLM's server takes them. Structured outputs: ``response_format``
(``json_object``, ``json_schema``) or vLLM's ``structured_outputs`` (``json``, ``regex``,
``choice``, ``grammar``) become the engine's guided decoding; a schema or pattern the engine
cannot compile is a 400 with its reason (from the worker).
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from conveyor.proto.errors import invalid_arg


class StreamOptions(msgspec.Struct):
    include_usage: bool = False
    # vLLM's extension: with include_usage, every chunk carries the usage so far (aiperf's
    # --per-chunk-usage reads it to count the tokens of a stream's first chunk).
    continuous_usage_stats: bool = False


class JsonSchema(msgspec.Struct):
    name: str | None = None
    schema: dict[str, Any] | bool | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(msgspec.Struct):
    type: str
    json_schema: JsonSchema | None = None


class Sampling(msgspec.Struct, kw_only=True):
    """What both endpoints share."""

    model: str
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # vLLM's extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    structured_outputs: dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    logprobs: Any = None  # completions: a number of alternatives; chat: true or false
    # refused when set
    logit_bias: dict[str, float] | None = None
    user: str | None = None


class CompletionRequest(Sampling, kw_only=True):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatRequest(Sampling, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None


_PASSED = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "top_k", "min_p",
           "repetition_penalty", "ignore_eos", "min_tokens")


T = TypeVar("T")


def decode(body: bytes, kind: type[T]) -> T:
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise invalid_arg(f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise invalid_arg(f"the request body is not valid JSON: {exc}") from None


def sampling_parameters(req: Sampling, max_tokens: int) -> dict[str, Any]:
    """The ``sampling_parameters`` JSON of Triton's vLLM model contract (vLLM's ``SamplingParams``)."""
    if req.n < 1:
        raise invalid_arg("n must be at least 1")
    if req.logit_bias:
        raise invalid_arg("logit_bias is not supported")
    if req.stream_options is not None and not req.stream:
        raise invalid_arg("`stream_options` can only be used when `stream` is True")
    if max_tokens < 1:
        raise invalid_arg("max_tokens must be at least 1")
    params: dict[str, Any] = {"n": req.n, "max_tokens": max_tokens}
    for name in _PASSED:
        value = getattr(req, name)
        if value is not None:
            params[name] = value
    if req.stop:
        params["stop"] = [req.stop] if isinstance(req.stop, str) else req.stop
    constraint = structured_outputs(req)
    if constraint is not None:
        params["structured_outputs"] = constraint
    top = logprobs_asked(req)
    if top is not None:
        params["logprobs"] = top
    return params


# vLLM's default ``max_logprobs``: more alternatives per token than this the engine refuses.
MAX_TOP_LOGPROBS = 20


def logprobs_asked(req: Sampling) -> int | None:
    """How many alternatives per token the answer carries besides the chosen token (vLLM's
    ``logprobs``); None: no logprobs. Chat asks with ``logprobs: true`` and ``top_logprobs``,
    completions with ``logprobs: N``."""
    if isinstance(req, ChatRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise invalid_arg("`top_logprobs` needs `logprobs` set to true")
        if req.logprobs in (None, False):
            return None
        if not isinstance(req.logprobs, bool):
            raise invalid_arg("`logprobs` of a chat request is true or false")
        top = req.top_logprobs or 0
    else:
        if req.logprobs is None:
            return None
        if isinstance(req.logprobs, bool) or not isinstance(req.logprobs, int):
            raise invalid_arg("`logprobs` of a completion request is a number of alternatives (0 to 20)")
        if isinstance(req, CompletionRequest) and req.echo:
            raise invalid_arg("`logprobs` with `echo` is not supported")
        top = req.logprobs
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise invalid_arg(f"`logprobs`/`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, got {top}")
    return top


def structured_outputs(req: Sampling) -> dict[str, Any] | None:
    """The guided-decoding constraint (vLLM's ``StructuredOutputsParams`` fields) the request asks for."""
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return req.structured_outputs
    if req.structured_outputs is not None:
        raise invalid_arg("`response_format` and `structured_outputs` cannot both be set")
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema is None:
            raise invalid_arg("`response_format` of type 'json_schema' needs `json_schema.schema`")
        return {"json": fmt.json_schema.schema}
    raise invalid_arg(f"unknown `response_format` type '{fmt.type}': expected 'text', 'json_object' or 'json_schema'")


def completion_prompt(req: CompletionRequest) -> str:
    if req.suffix:
        raise invalid_arg("suffix is not supported")
    if req.best_of not in (None, 1):
        raise invalid_arg("best_of is not supported")
    prompt = req.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise invalid_arg("only a single prompt string is supported")
        prompt = prompt[0]
    if not prompt:
        raise invalid_arg("prompt must be non-empty")
    return prompt


def chat_messages(req: ChatRequest) -> list[dict[str, str]]:
    """The conversation as a chat template reads it: text parts joined by newlines, as vLLM does."""
    if req.tools or req.tool_choice not in (None, "none"):
        raise invalid_arg("tools are not supported")
    if not req.messages:
        raise invalid_arg("messages must be non-empty")
    out = []
    for msg in req.messages:
        content = msg.content
        if isinstance(content, list):
            if any(part.type != "text" for part in content):
                raise invalid_arg("only text content parts are supported")
            content = "\n".join(part.text or "" for part in content)
        entry = {"role": msg.role, "content": content or ""}
        if msg.name:
            entry["name"] = msg.name
        out.append(entry)
    return out
