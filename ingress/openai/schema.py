"""The request bodies of ``/v1/completions`` and ``/v1/chat/completions``, decoded and
type-checked in one pass (msgspec), and the sampling parameters they carry.

Fields the OpenAI API defines but this ingress cannot honour (``logprobs``,
``logit_bias``, ``suffix``, tools) are refused with a 400 rather than ignored;
unknown fields are ignored, as OpenAI's own server does. vLLM's extensions to the
API (``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos``, ``min_tokens``)
pass through, as vLLM's server takes them, and so does ``stream_options.continuous_usage_stats``
(the usage so far on every chunk).
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
    # refused when set
    logprobs: Any = None
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
    if req.logprobs not in (None, False, 0):
        raise invalid_arg("logprobs are not supported")
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
    return params


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
    if req.top_logprobs:
        raise invalid_arg("logprobs are not supported")
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
