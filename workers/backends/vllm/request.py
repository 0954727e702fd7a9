"""A generation request's inputs, as Triton's vllm_backend reads them: the prompt, ``stream``,
``exclude_input_in_output``, the ``return_*`` flags and ``sampling_parameters`` (JSON; without it,
the request's parameters), with ``lora_name`` picking an adapter. (An embedding request, with
``embedding_request``: ``embedding.py``.)

Conveyor's additions: ``input_ids`` (INT32 or INT64), a prompt of token ids, which the engine gets as
vLLM's ``TokensPrompt`` (``text_input`` is then ignored: the config requires it); and
``return_prompt_logprobs``: the ``prompt_logprobs`` output (the sampling parameters ask the engine for
them with vLLM's ``prompt_logprobs``); the request parameter ``conveyor_resumable``: a stream's responses
carry its token ids (``outputs.token_ids``), for an ingress to resume it if its worker dies;
``conveyor_steps``: the responses carry no tensors, their step in the parameters (``outputs.step``); and
vLLM's ``priority`` among the sampling parameters: the engine's scheduling priority of the request.

Every sampling parameter is checked against ``proto/llm_limits.py`` before the engine sees it: the counts and
sizes a client chooses (stop strings, token-id lists, guided-decoding schemas, ...), and integers the engine's
transport cannot carry (past 64 bits vLLM's engine fails the request: a 500, not a 400)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conveyor.proto import llm_limits
from conveyor.proto.errors import internal, invalid_arg
from conveyor.proto.migration import MIGRATION, RESUMABLE
from conveyor.proto.prefix_keys import KEYED_BYTES, PREFIX_BLOCK_BYTES, block_keys
from conveyor.proto.stream_steps import STEPS
from conveyor.workers.backends.base import RequestItem
from conveyor.workers.backends.vllm import media

RETURNS = (
    "return_finish_reason", "return_cumulative_logprob", "return_logprobs",
    "return_num_input_tokens", "return_num_output_tokens", "return_prompt_logprobs", "return_num_cached_tokens",
)
IDS_INPUT = "input_ids"
# Request parameters that are inputs of this model, not sampling parameters (a generate call may
# put them among its parameters).
_NOT_SAMPLING = frozenset(("stream", "exclude_input_in_output", *RETURNS, RESUMABLE, MIGRATION, STEPS))


@dataclass(slots=True)
class GenerateArgs:
    prompt: str | list[int]  # text, or token ids
    stream: bool
    prepend_input: bool  # the prompt leads the (non-streamed) text_output
    sampling: dict[str, Any]  # SamplingParams keyword arguments
    lora_name: str | None
    returns: frozenset[str]  # the return_* flags set
    # An ingress may resume the stream elsewhere: each response carries its new token ids
    # (proto/migration.py).
    token_ids: bool = False
    # The OpenAI ingress reads each response from its parameters, not its tensors (proto/stream_steps.py).
    steps: bool = False
    priority: int = 0  # vLLM's: the engine's scheduling priority (lower first, with its "priority" policy)
    # Triton's ``image`` input: base64 elements, counted and sized (media.py); decoded once the engine's
    # limits are checked (``pictures``).
    images: list[bytes] = field(default_factory=list)
    pictures: list[Any] = field(default_factory=list)


def _first(inputs: dict[str, np.ndarray], name: str) -> Any:
    array = inputs.get(name)
    if array is None or array.size == 0:
        return None
    return array.reshape(-1)[0]


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def parse(item: RequestItem) -> GenerateArgs:
    inputs = item.inputs
    prompt = _first(inputs, "text_input")
    if prompt is None:
        raise invalid_arg("input 'text_input' is required")
    stream = bool(_first(inputs, "stream") or False)
    exclude = _first(inputs, "exclude_input_in_output")
    # Triton: the prompt is prepended unless excluded, and a stream excludes it by default.
    prepend = (not bool(exclude)) if exclude is not None else not stream
    if prepend and stream:
        # Triton's vllm_backend fails it while generating: its status (INTERNAL) and its words.
        raise internal("Error generating stream: When streaming, `exclude_input_in_output` = False is not allowed.")
    raw = _first(inputs, "sampling_parameters")
    if raw is not None:
        try:
            sampling = json.loads(_text(raw))
        except ValueError as exc:
            raise invalid_arg(f"'sampling_parameters' is not valid JSON: {exc}") from None
        except RecursionError:  # json recurses into nested arrays and objects
            raise invalid_arg("'sampling_parameters' is nested too deeply to decode") from None
        if not isinstance(sampling, dict):
            raise invalid_arg("'sampling_parameters' must be a JSON object")
    else:
        sampling = {k: v for k, v in item.parameters.items() if k not in _NOT_SAMPLING}
    lora = sampling.pop("lora_name", None)
    priority = _priority(sampling.pop("priority", None))
    returns = frozenset(name for name in RETURNS if bool(_first(inputs, name) or False))
    ids = inputs.get(IDS_INPUT)
    text: str | list[int] = _text(prompt)
    if ids is not None:
        if ids.size == 0:
            raise invalid_arg(f"input '{IDS_INPUT}' is empty")
        text = [int(t) for t in ids.reshape(-1)]
    return GenerateArgs(text, stream, prepend, sampling, None if lora is None else str(lora), returns,
                        bool(item.parameters.get(RESUMABLE)), bool(item.parameters.get(STEPS)), priority,
                        media.elements(inputs))


def _priority(value: Any) -> int:
    if value is None:
        return 0
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise invalid_arg(f"sampling parameter 'priority': cannot use {value!r} as int") from None
    llm_limits.check_int64("priority", number)
    return number


def prefix_keys(item: RequestItem, args: GenerateArgs) -> tuple[list[int], bool]:
    """The request's prefix keys as its ingress computed them (ingress/prefix_key.py), and whether they
    are keys of token ids (``input_ids`` of INT32) rather than of the text."""
    named = item.parameters.get("lora_name")  # the ingress reads the parameter before the sampling JSON
    adapter = named if isinstance(named, str) else (args.lora_name or "")
    images = media.media_bytes(args.images)
    ids = item.inputs.get(IDS_INPUT)
    if ids is not None and ids.dtype == np.int32 and ids.nbytes >= PREFIX_BLOCK_BYTES:
        return block_keys(np.ascontiguousarray(ids).reshape(-1)[:KEYED_BYTES // 4].tobytes(), adapter, images), True
    prompt = _first(item.inputs, "text_input")
    text = prompt.encode() if isinstance(prompt, str) else prompt or b""
    return block_keys(text[:KEYED_BYTES], adapter, images), False


def engine_prompt(prompt: str | list[int], pictures: list[Any] | None = None) -> Any:
    """The engine's prompt: text or token ids, with the request's decoded images as ``multi_modal_data``."""
    if isinstance(prompt, str) and not pictures:
        return prompt
    from vllm.inputs import TextPrompt, TokensPrompt

    mm = {"multi_modal_data": {"image": pictures}} if pictures else {}
    if isinstance(prompt, str):
        return TextPrompt(prompt=prompt, **mm)
    return TokensPrompt(prompt_token_ids=prompt, **mm)


def sampling_params(values: dict[str, Any], final_only: bool) -> Any:
    """vLLM's ``SamplingParams``; numbers given as strings (request parameters) are converted, as Triton
    converts them by the field's type. ``final_only``: the engine yields the finished request only (all
    ``n`` sequences at once), not every step before it."""
    llm_limits.check_sampling(values)  # the engine checks n and logprobs against its own (configurable) maxima
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    fields = SamplingParams.__annotations__
    convert: dict[str, Callable[[Any], Any]] = {
        "int": int, "float": float, "bool": _bool, "str": str, "int | None": int, "float | None": float,
    }
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key in STRUCTURED_OUTPUTS_KEYS:
            kwargs["structured_outputs"] = structured_outputs(key, value)
            continue
        if key == "logit_bias":
            kwargs[key] = logit_bias(value)
            continue
        if key not in fields or key == "output_kind":  # the backend picks it
            raise invalid_arg(f"unknown sampling parameter '{key}'")
        hint = fields[key]
        kind = hint.__name__ if isinstance(hint, type) else str(hint)
        to = convert.get(kind)
        try:
            kwargs[key] = to(value) if to is not None and value is not None else value
        except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite float as an int
            raise invalid_arg(f"sampling parameter '{key}': cannot use {value!r} as {kind}") from None
    if final_only:
        kwargs["output_kind"] = RequestOutputKind.FINAL_ONLY
    try:
        return SamplingParams(**kwargs)
    except (TypeError, ValueError) as exc:
        raise invalid_arg(f"invalid sampling parameters: {exc}") from None


LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range of a bias; vLLM clips to it too


def logit_bias(value: Any) -> dict[int, float] | None:
    """``logit_bias`` as vLLM's ``SamplingParams`` takes it: token ids (JSON gives their text) to biases,
    clipped to OpenAI's range, as vLLM's server converts them (``SamplingParams.from_optional``); the
    engine refuses ids past its vocabulary (400)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid_arg("sampling parameter 'logit_bias' must be an object of token ids to biases")
    out: dict[int, float] = {}
    for token, bias in value.items():
        try:
            out[int(token)] = min(LOGIT_BIAS_LIMIT, max(-LOGIT_BIAS_LIMIT, float(bias)))
        except (TypeError, ValueError):
            raise invalid_arg(f"logit_bias contains key(s) that cannot be converted to integer token IDs: "
                              f"{[token]!r}") from None
    return out


# The constraint of structured outputs (guided decoding): vLLM's ``structured_outputs``, and
# ``guided_decoding``, the name Triton's vllm_backend reads (vLLM's before 0.11). Either is a JSON
# object (or its text) of ``StructuredOutputsParams``: ``json``, ``regex``, ``choice``, ``grammar``,
# ``json_object``, ...
STRUCTURED_OUTPUTS_KEYS = ("structured_outputs", "guided_decoding")


def structured_outputs(key: str, value: Any) -> Any:
    from vllm.sampling_params import StructuredOutputsParams

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise invalid_arg(f"sampling parameter '{key}' is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise invalid_arg(f"sampling parameter '{key}' must be a JSON object")
    try:
        return StructuredOutputsParams(**value)
    except (TypeError, ValueError) as exc:  # an unknown field; no constraint, or more than one
        raise invalid_arg(f"sampling parameter '{key}': {exc}") from None


def _bool(value: Any) -> bool:
    return value.lower() == "true" if isinstance(value, str) else bool(value)
