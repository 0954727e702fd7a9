"""The prefix keys of a request's prompt (proto/prefix_keys.py), read from its inputs as the ingress wrote
them to the arena: ``text_input``'s first element, or ``input_ids`` when the prompt is tokenized (the engine
ignores the text then), under the LoRA adapter the request names, with its ``image`` tensor's bytes hashed in."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from conveyor.proto import messages as m
from conveyor.proto.prefix_keys import PREFIX_BLOCK_BYTES, block_keys

PROMPT_INPUT = "text_input"  # Triton's vLLM contract: the prompt
SAMPLING_INPUT = "sampling_parameters"  # ... and its JSON sampling parameters, which name the adapter
IDS_INPUT = "input_ids"  # ... or the prompt as token ids (INT32), which the engine takes instead of the text
IMAGE_INPUT = "image"  # ... and its images (BYTES, base64), hashed into every key
ADAPTER = "lora_name"
_LENGTH = 4  # a BYTES element's little-endian length, before its bytes


View = Callable[[int, int], np.ndarray]  # the arena's: (offset, nbytes) -> its bytes


def prefix_key(refs: list[m.TensorRef], view: View, parameters: dict[str, Any]) -> list[int]:
    """The keys of the prompt's whole blocks (its first element's), in order; [] without a prompt
    as long as one block. ``view``: the arena's, as the request's inputs were written there."""
    prompt = sampling = ids = image = None
    for ref in refs:
        if ref.name == PROMPT_INPUT:
            prompt = ref
        elif ref.name == SAMPLING_INPUT:
            sampling = ref
        elif ref.name == IDS_INPUT:
            ids = ref
        elif ref.name == IMAGE_INPUT:
            image = ref
    if ids is not None and ids.datatype == "INT32" and ids.nbytes >= PREFIX_BLOCK_BYTES:
        start, length = 0, ids.nbytes  # a tokenized prompt (the engine ignores the text then): 16 ids a block
        raw = view(ids.offset, ids.nbytes)
    elif prompt is not None and prompt.datatype == "BYTES" and prompt.nbytes >= _LENGTH + PREFIX_BLOCK_BYTES:
        raw = view(prompt.offset, prompt.nbytes)
        start, length = _LENGTH, min(int.from_bytes(raw[:_LENGTH].tobytes(), "little"), prompt.nbytes - _LENGTH)
    else:
        return []
    media = [view(image.offset, image.nbytes).data] if image is not None and image.datatype == "BYTES" else []
    return block_keys(raw.data[start:start + length], _adapter(sampling, view, parameters), media)


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
