"""A prompt's prefix key: chained hashes of its leading blocks, for prefix-aware engine placement.

An engine's prefix cache keeps a prompt's KV blocks under the hash of every token up to and in each
block, so a request whose prompt starts as an earlier one's reuses those blocks, on the engine that
ran the earlier one. The router, which never reads tensor bytes, places requests by the same idea
(router/scheduling/engine_placement.py) on keys the ingress computes here while the prompt is hot in
its cache: key ``i`` is the CRC-32 of the adapter's name and the prompt's first
``(i + 1) * PREFIX_BLOCK_BYTES`` bytes. Two prompts share key ``i`` exactly when they share that much
text under the same adapter; a CRC collision costs a worse placement, never a wrong answer. Only
whole blocks, as an engine caches only whole blocks.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from conveyor.proto import messages as m

# ~16 tokens of English text: the block size of vLLM's GPU engines, so a key stands for about one
# cached block. (A CPU engine's blocks are larger; the keys are then finer than its blocks, which
# costs nothing but a few keys.)
PREFIX_BLOCK_BYTES = 64
# Keys for the prompt's first 4 KiB at most: the shared head (a system prompt, a document) decides
# where a prompt's blocks are; this bounds the descriptor (~330 bytes of keys) and the router's work
# and record per request.
MAX_PREFIX_BLOCKS = 64
PROMPT_INPUT = "text_input"  # Triton's vLLM contract: the prompt
SAMPLING_INPUT = "sampling_parameters"  # ... and its JSON sampling parameters, which name the adapter
IDS_INPUT = "input_ids"  # ... or the prompt as token ids (INT32), which the engine takes instead of the text
ADAPTER = "lora_name"
_LENGTH = 4  # a BYTES element's little-endian length, before its bytes


View = Callable[[int, int], np.ndarray]  # the arena's: (offset, nbytes) -> its bytes


def prefix_key(refs: list[m.TensorRef], view: View, parameters: dict[str, Any]) -> list[int]:
    """The keys of the prompt's whole blocks (its first element's), in order; [] without a prompt
    as long as one block. ``view``: the arena's, as the request's inputs were written there."""
    prompt = sampling = ids = None
    for ref in refs:
        if ref.name == PROMPT_INPUT:
            prompt = ref
        elif ref.name == SAMPLING_INPUT:
            sampling = ref
        elif ref.name == IDS_INPUT:
            ids = ref
    if ids is not None and ids.datatype == "INT32" and ids.nbytes >= PREFIX_BLOCK_BYTES:
        start, length = 0, ids.nbytes  # a tokenized prompt (the engine ignores the text then): 16 ids a block
        raw = view(ids.offset, ids.nbytes)
    elif prompt is not None and prompt.datatype == "BYTES" and prompt.nbytes >= _LENGTH + PREFIX_BLOCK_BYTES:
        raw = view(prompt.offset, prompt.nbytes)
        start, length = _LENGTH, min(int.from_bytes(raw[:_LENGTH].tobytes(), "little"), prompt.nbytes - _LENGTH)
    else:
        return []
    blocks = min(length // PREFIX_BLOCK_BYTES, MAX_PREFIX_BLOCKS)
    adapter = _adapter(sampling, view, parameters)
    h = zlib.crc32(adapter.encode() + b"\0") if adapter else 0
    data = raw.data
    keys = []
    for end in range(start + PREFIX_BLOCK_BYTES, start + (blocks + 1) * PREFIX_BLOCK_BYTES, PREFIX_BLOCK_BYTES):
        h = zlib.crc32(data[end - PREFIX_BLOCK_BYTES:end], h)
        keys.append(h)
    return keys


def _adapter(sampling: m.TensorRef | None, view: View, parameters: dict[str, Any]) -> str:
    """The LoRA adapter the request names: in its parameters, or in its sampling JSON (read only
    when it names one)."""
    name = parameters.get(ADAPTER)
    if name is None and sampling is not None and sampling.datatype == "BYTES" and sampling.nbytes > _LENGTH:
        raw = view(sampling.offset, sampling.nbytes)
        text = raw[_LENGTH:_LENGTH + int.from_bytes(raw[:_LENGTH].tobytes(), "little")].tobytes()
        if ADAPTER.encode() in text:
            try:
                values = json.loads(text)
            except ValueError:
                return ""  # the worker refuses it
            name = values.get(ADAPTER) if isinstance(values, dict) else None
    return name if isinstance(name, str) else ""
