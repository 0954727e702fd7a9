"""An embedding request to a pooling engine, as Triton's vllm_backend takes it (``EmbedRequest``).

The request carries the optional BYTES input ``embedding_request``: one JSON object,
``{"input": <a string, or a list of token ids>, "pooling_params": {"dimensions": [d]}}`` (Triton's
OpenAI frontend sends ``dimensions`` as a one-element list; a plain number is taken too, and
``use_activation``, vLLM's, passes through). ``text_input`` is still sent (the config requires it)
and ignored. The engine's ``encode`` runs it with ``PoolingParams(task="embed")``; the one final
response holds ``text_output``: the vector as a JSON array of numbers (each the float32 value
exactly), and, when asked with the ``return_*`` inputs, ``num_input_tokens`` and
``num_output_tokens`` (0: nothing is generated), as Triton's backend answers.

A model whose engine does not pool (a generative one), asked for an embedding, or a pooling
engine asked to generate, is refused with Triton's words, ``Model <m> does not support '<task>'
request``, as UNSUPPORTED: the OpenAI ingress reads that refusal as vLLM's "The model does not
support ... API" (``ingress/openai/contract.py``).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from conveyor.proto.datatypes import pack_bytes
from conveyor.proto.errors import ConveyorError, invalid_arg, unsupported
from conveyor.workers.backends.base import RequestItem, WireTensor

EMBEDDING_INPUT = "embedding_request"
EMBED_TASK = "embed"
GENERATE_TASK = "generate"
_RETURNS = ("return_num_input_tokens", "return_num_output_tokens")


@dataclass(slots=True)
class EmbedArgs:
    prompt: str | list[int]  # text, or the prompt's token ids
    dimensions: int | None  # a Matryoshka model's shorter vector (the engine checks it)
    use_activation: bool | None  # None: the pooler's default (normalized)
    returns: frozenset[str]  # the return_* flags set


def task_refused(model: str, task: str) -> ConveyorError:
    """Triton's vllm_backend's words for a request of a task the engine does not serve."""
    return unsupported(f"Model {model} does not support '{task}' request")


def _flag(inputs: dict[str, np.ndarray], name: str) -> bool:
    array = inputs.get(name)
    return array is not None and array.size > 0 and bool(array.reshape(-1)[0])


def parse(item: RequestItem) -> EmbedArgs:
    array = item.inputs[EMBEDDING_INPUT]
    if array.size == 0:
        raise invalid_arg(f"input '{EMBEDDING_INPUT}' is empty")
    raw = array.reshape(-1)[0]
    try:
        doc = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
    except (UnicodeDecodeError, ValueError) as exc:
        raise invalid_arg(f"'{EMBEDDING_INPUT}' is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or "input" not in doc:
        raise invalid_arg(f"'{EMBEDDING_INPUT}' must be a JSON object with an 'input'")
    prompt = doc["input"]
    ids = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not isinstance(prompt, str) and not (ids and prompt):
        raise invalid_arg(f"'{EMBEDDING_INPUT}': 'input' is one prompt: a string or a list of token ids")
    pooling = doc.get("pooling_params")
    pooling = {} if pooling is None else pooling
    if not isinstance(pooling, dict):
        raise invalid_arg(f"'{EMBEDDING_INPUT}': 'pooling_params' must be an object")
    dims = pooling.get("dimensions")
    if isinstance(dims, list):  # Triton's frontend: [d]
        dims = dims[0] if len(dims) == 1 else dims
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool)):
        raise invalid_arg(f"'{EMBEDDING_INPUT}': 'dimensions' must be a number, got {dims!r}")
    activation = pooling.get("use_activation")
    if activation is not None and not isinstance(activation, bool):
        raise invalid_arg(f"'{EMBEDDING_INPUT}': 'use_activation' must be true or false")
    returns = frozenset(name for name in _RETURNS if _flag(item.inputs, name))
    return EmbedArgs(prompt, dims, activation, returns)


def engine_prompt(args: EmbedArgs) -> Any:
    if isinstance(args.prompt, str):
        return args.prompt
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=args.prompt)


def pooling_params(args: EmbedArgs) -> Any:
    from vllm import PoolingParams

    return PoolingParams(task=EMBED_TASK, dimensions=args.dimensions, use_activation=args.use_activation)


def build(output: Any, returns: frozenset[str]) -> dict[str, WireTensor | np.ndarray]:
    """The one response of a ``PoolingRequestOutput``. ``tolist`` gives each float32 (or half) value
    as the double that equals it, and JSON writes a double so that it reads back the same: exact."""
    vector = orjson.dumps(output.outputs.data.flatten().tolist())
    out: dict[str, WireTensor | np.ndarray] = {"text_output": WireTensor("BYTES", [1], pack_bytes([vector]))}
    if "return_num_input_tokens" in returns:
        out["num_input_tokens"] = WireTensor("UINT32", [1], struct.pack("<I", len(output.prompt_token_ids or ())))
    if "return_num_output_tokens" in returns:
        out["num_output_tokens"] = WireTensor("UINT32", [1], struct.pack("<I", 0))
    return out
