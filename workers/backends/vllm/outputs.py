"""The engine's ``RequestOutput``s as the model's outputs, as Triton's vllm_backend builds them.

A stream sends what is new since its previous response (text, logprobs, token counts); a
non-streamed request gets the whole text once, after its prompt unless ``exclude_input_in_output``.
Arrays have one element per sequence (``n``); ``num_input_tokens`` has shape [1], as its config dims.

With ``n > 1`` vLLM (v1) runs each sequence as a child request, and a ``RequestOutput`` holds only
the sequences that moved, each with its ``index``: ``ResponseState`` keeps the latest of each, so
every response has all ``n`` elements in index order (empty for a sequence that did not move), and
a sequence's finish reason appears once, in the response where it finished ("None" otherwise).
Triton's backend pairs outputs by position instead, which mixes sequences up under vLLM v1.

``prompt_logprobs`` (Conveyor's, with ``return_prompt_logprobs``): the prompt's tokens' logprobs, in the
first response that has them, as ``logprobs`` writes a sequence's; the first token, which has none,
is listed with a null logprob and its text. A logprob of -inf is written as -9999.0, vLLM's server's
floor (JSON has no infinity). ``num_cached_tokens`` (Conveyor's, with ``return_num_cached_tokens``):
the prompt's tokens found in the engine's prefix cache, vLLM's ``num_cached_tokens``.

``token_ids`` (a request an ingress may resume on another engine, ``proto/migration.py``): the
response parameters that carry the new token ids, and the prompt's in the first response.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from conveyor.proto import stream_steps as steps
from conveyor.proto.datatypes import pack_bytes
from conveyor.proto.migration import OUTPUT_IDS, PROMPT_IDS
from conveyor.workers.backends.base import WireTensor


class ResponseState:
    """One request's sequences as last seen, and what its earlier responses held of each."""

    __slots__ = ("cached_tokens", "decode", "finished", "ids_sent", "logprobs", "prompt", "prompt_ids",
                 "prompt_ids_sent", "prompt_logprobs", "prompt_sent", "prompt_tokens", "seqs", "text", "tokens")

    def __init__(self, n: int, decode: Callable[[int], str] | None = None) -> None:
        """``decode``: a token's text (the engine's tokenizer), for the prompt's first token."""
        self.seqs: list[Any] = [None] * n  # the latest CompletionOutput of each index
        self.prompt: str | None = None
        self.prompt_tokens = 0
        self.text = [0] * n
        self.logprobs = [0] * n
        self.tokens = [0] * n
        self.finished = [False] * n
        self.decode = decode
        self.prompt_ids: list[int] = []
        self.prompt_logprobs: Any = None  # the engine's, until a response carries them
        self.prompt_sent = False
        self.cached_tokens = 0
        self.ids_sent = 0  # the token ids ``token_ids`` gave so far (one sequence)
        self.prompt_ids_sent = False

    def merge(self, output: Any) -> None:
        if self.prompt is None:  # the prompt is the same in every output: copied once, not per token
            self.prompt = output.prompt or ""
            self.prompt_ids = list(output.prompt_token_ids or ())
            self.prompt_tokens = len(self.prompt_ids)
        self.cached_tokens = output.num_cached_tokens or 0
        if output.prompt_logprobs and not self.prompt_sent:
            self.prompt_logprobs = output.prompt_logprobs
        for seq in output.outputs:
            self.seqs[seq.index] = seq


def _strings(values: list[str]) -> WireTensor:
    return WireTensor("BYTES", [len(values)], pack_bytes([v.encode("utf-8") for v in values]))


def _counts(values: list[int]) -> WireTensor:
    return WireTensor("UINT32", [len(values)], struct.pack(f"<{len(values)}I", *values))


def build(state: ResponseState, prepend_prompt: bool, returns: frozenset[str]) -> dict[str, WireTensor | np.ndarray]:
    """The next response: what is new in ``state`` since the previous one (in wire form: a stream
    builds one per token)."""
    seqs = state.seqs
    out: dict[str, WireTensor | np.ndarray] = {"text_output": _strings(_new_texts(state, prepend_prompt))}
    if "return_finish_reason" in returns:
        out["finish_reason"] = _strings([reason or "None" for reason in _finish_reasons(state)])
    if "return_cumulative_logprob" in returns:
        out["cumulative_logprob"] = np.asarray([None if s is None else s.cumulative_logprob for s in seqs],
                                               dtype=np.float32)
    if "return_logprobs" in returns:
        out["logprobs"] = _strings(_logprobs(state))
    if "return_prompt_logprobs" in returns:
        out["prompt_logprobs"] = _strings([_prompt_logprobs(state)])
    if "return_num_input_tokens" in returns:
        out["num_input_tokens"] = _counts([state.prompt_tokens])
    if "return_num_cached_tokens" in returns:
        out["num_cached_tokens"] = _counts([state.cached_tokens])
    if "return_num_output_tokens" in returns:
        out["num_output_tokens"] = _counts(_new_counts(state))
    return out


def step(state: ResponseState, prepend_prompt: bool, returns: frozenset[str]) -> list[Any]:
    """The next response as a step in its parameters (``proto/stream_steps.py``): what ``build`` puts in
    tensors, as plain values (``cumulative_logprob``, which the OpenAI ingress never asks for, has none)."""
    out: list[Any] = [None] * steps.FIELDS
    out[steps.TEXTS] = _new_texts(state, prepend_prompt)
    if "return_finish_reason" in returns:
        reasons = out[steps.FINISH] = _finish_reasons(state)
        out[steps.STOP_STRINGS] = _stop_strings(state, reasons)
    if "return_num_output_tokens" in returns:
        out[steps.OUTPUT_TOKENS] = sum(_new_counts(state))
    if "return_num_input_tokens" in returns:
        out[steps.PROMPT_TOKENS] = state.prompt_tokens
    if "return_num_cached_tokens" in returns:
        out[steps.CACHED_TOKENS] = state.cached_tokens
    if "return_logprobs" in returns:
        out[steps.LOGPROBS] = _logprobs(state)
    if "return_prompt_logprobs" in returns:
        found = _prompt_logprobs(state)
        out[steps.PROMPT_LOGPROBS] = None if found == "null" else found
    return out


def _new_texts(state: ResponseState, prepend_prompt: bool) -> list[str]:
    lead = (state.prompt or "") if prepend_prompt else ""
    texts = []
    for i, s in enumerate(state.seqs):
        text = "" if s is None else s.text
        texts.append(lead + text[state.text[i]:])
        state.text[i] = len(text)
    return texts


def _new_counts(state: ResponseState) -> list[int]:
    counts = []
    for i, s in enumerate(state.seqs):
        total = 0 if s is None else len(s.token_ids)
        counts.append(total - state.tokens[i])
        state.tokens[i] = total
    return counts


def token_ids(state: ResponseState) -> dict[str, list[int]]:
    """The next response's parameters for a resumable stream (one sequence): the ids generated since the
    previous response, and the prompt's in the first. Read before ``build``, as both advance together."""
    seq = state.seqs[0]
    ids = [] if seq is None else list(seq.token_ids[state.ids_sent:])
    state.ids_sent += len(ids)
    out = {OUTPUT_IDS: ids}
    if not state.prompt_ids_sent:
        out[PROMPT_IDS] = state.prompt_ids
        state.prompt_ids_sent = True
    return out


def _finish_reasons(state: ResponseState) -> list[str | None]:
    reasons: list[str | None] = []
    for i, s in enumerate(state.seqs):
        done = s is not None and s.finish_reason is not None
        reasons.append(str(s.finish_reason) if done and not state.finished[i] else None)
        state.finished[i] = state.finished[i] or done
    return reasons


def _stop_strings(state: ResponseState, reasons: list[str | None]) -> list[str | None] | None:
    """The stop string each sequence finishing now stopped on (vLLM's ``stop_reason`` when it is a string:
    a token id or None is no stop string); None when none did, as most steps."""
    stops = [s.stop_reason if reason is not None and isinstance(s.stop_reason, str) else None
             for s, reason in zip(state.seqs, reasons, strict=True)]
    return stops if any(stop is not None for stop in stops) else None


def _logprobs(state: ResponseState) -> list[str]:
    """Per sequence, the new tokens' logprobs as JSON ("null" when the request asked for none)."""
    texts = []
    for i, s in enumerate(state.seqs):
        if s is None or s.logprobs is None:
            texts.append("null")
            continue
        texts.append(json.dumps([_position(step) for step in s.logprobs[state.logprobs[i]:]]))
        state.logprobs[i] = len(s.logprobs)
    return texts


def _position(step: dict[int, Any]) -> dict[str, Any]:
    return {str(token): {"logprob": max(lp.logprob, MIN_LOGPROB), "rank": lp.rank, "decoded_token": lp.decoded_token}
            for token, lp in step.items()}


MIN_LOGPROB = -9999.0  # vLLM's server's stand-in for -inf


def _prompt_logprobs(state: ResponseState) -> str:
    """The prompt's logprobs, once ("null" before the engine gives them and after they were sent)."""
    found = state.prompt_logprobs
    if found is None or state.prompt_sent:
        return "null"
    state.prompt_sent = True
    state.prompt_logprobs = None
    steps: list[dict[str, Any]] = []
    for j, step in enumerate(found):
        if step is None:  # the first token: nothing before it to predict it
            token = state.prompt_ids[j] if j < len(state.prompt_ids) else 0
            text = state.decode(token) if state.decode is not None else ""
            steps.append({str(token): {"logprob": None, "rank": None, "decoded_token": text}})
        else:
            steps.append(_position(step))
    return json.dumps(steps)
