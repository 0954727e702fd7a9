"""The engine's ``RequestOutput``s as the model's outputs, as Triton's vllm_backend builds them.

A stream sends what is new since its previous response (text, logprobs, token counts); a
non-streamed request gets the whole text once, after its prompt unless ``exclude_input_in_output``.
Arrays have one element per sequence (``n``); ``num_input_tokens`` has shape [1], as its config dims.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np


class ResponseState:
    """What one request's earlier responses held, per sequence."""

    __slots__ = ("logprobs", "text", "tokens")

    def __init__(self) -> None:
        self.text: list[int] | None = None
        self.logprobs: list[int] | None = None
        self.tokens: list[int] | None = None


def _objects(values: list[bytes] | list[str]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
    return array


def build(output: Any, state: ResponseState, prepend_prompt: bool, returns: frozenset[str]) -> dict[str, np.ndarray]:
    seqs = output.outputs
    n = len(seqs)
    first = state.text is None
    prev = state.text or [0] * n
    lead = (output.prompt or "") if first and prepend_prompt else ""
    out: dict[str, np.ndarray] = {
        "text_output": _objects([lead + s.text[p:] for s, p in zip(seqs, prev, strict=True)]),
    }
    state.text = [len(s.text) for s in seqs]
    if "return_finish_reason" in returns:
        out["finish_reason"] = _objects([str(s.finish_reason) for s in seqs])
    if "return_cumulative_logprob" in returns:
        out["cumulative_logprob"] = np.asarray([s.cumulative_logprob for s in seqs], dtype=np.float32)
    if "return_logprobs" in returns:
        out["logprobs"] = _objects(_logprobs(seqs, state))
    if "return_num_input_tokens" in returns:
        out["num_input_tokens"] = np.asarray([len(output.prompt_token_ids or ())], dtype=np.uint32)
    if "return_num_output_tokens" in returns:
        before = state.tokens or [0] * n
        out["num_output_tokens"] = np.asarray([len(s.token_ids) - b for s, b in zip(seqs, before, strict=True)],
                                              dtype=np.uint32)
        state.tokens = [len(s.token_ids) for s in seqs]
    return out


def _logprobs(seqs: Any, state: ResponseState) -> list[str]:
    """Per sequence, the new tokens' logprobs as JSON ("null" when the request asked for none)."""
    prev = state.logprobs or [0] * len(seqs)
    texts = []
    for i, s in enumerate(seqs):
        if s.logprobs is None:
            texts.append("null")
            continue
        texts.append(json.dumps([
            {str(token): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
             for token, lp in step.items()}
            for step in s.logprobs[prev[i]:]
        ]))
        prev[i] = len(s.logprobs)
    state.logprobs = prev
    return texts
