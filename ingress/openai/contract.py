"""How a model takes a generation request: the ``text_input`` / ``text_output`` contract that
Triton's vLLM and TensorRT-LLM backends share, read from the model's signature alone.

A model is generative when it has a BYTES ``text_input`` and a BYTES ``text_output``: the
``vllm`` backend, a TensorRT-LLM ensemble, or any Python model written to the shape, decoupled
or not. What else it declares says how an OpenAI request reaches it:

* ``sampling_parameters`` (BYTES): the sampling fields go in it as one JSON object (vLLM's
  ``SamplingParams``: ``n``, ``stop``, ``structured_outputs``, ``lora_name``, ...), as today;
* otherwise each field goes in the input of its name the model declares, in that input's
  datatype (Triton's TensorRT-LLM names: ``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
  ``seed`` or ``random_seed``, ``stop_words``, the penalties, ``num_return_sequences`` for
  ``n``); a field the model declares no input for is not sent, as a model that cannot take
  ``temperature`` can only ignore it. What has no tensor of its own (guided decoding, an
  adapter, ``n`` > 1 without ``num_return_sequences``) is a 400 naming what is missing;
* ``num_input_tokens`` and ``num_output_tokens`` outputs: the model counts its tokens for
  ``usage``; without them the ingress counts with the model's tokenizer, if it has one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from conveyor.proto.datatypes import numpy_dtype
from conveyor.proto.errors import ConveyorError, Status, invalid_arg
from conveyor.proto.request_checks import InferInput
from conveyor.proto.signature import ModelSignature, TensorSpec

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
IDS_INPUT = "input_ids"  # a prompt of token ids (TensorRT-LLM's name for a tokenized prompt)
SAMPLING_INPUT = "sampling_parameters"
COUNT_OUTPUTS = ("num_input_tokens", "num_output_tokens")
# Triton's vllm_backend's input of an embedding request (a JSON object: ``embeddings.py``); a model that
# declares it may pool. Whether its engine does, the model says by refusing the other task (below).
EMBEDDING_INPUT = "embedding_request"
# How a model refuses a task its engine does not serve: Triton's vllm_backend's words ("Model m does
# not support 'embed' request"), which ours sends as UNSUPPORTED; Triton's own, wrapped in "Error
# generating stream: ...", is read too. The ingress answers it in vLLM's words, as a 400.
_TASK_REFUSED = re.compile(r"does not support '(\w+)' request")

# A sampling field (vLLM's name, as ``schema.sampling_parameters`` writes it) -> the inputs that may
# take it, first declared wins: Triton's TensorRT-LLM names, and the same names where they agree.
TENSOR_FIELDS: dict[str, tuple[str, ...]] = {
    "max_tokens": ("max_tokens",),
    "temperature": ("temperature",),
    "top_p": ("top_p",),
    "top_k": ("top_k",),
    "seed": ("seed", "random_seed"),
    "presence_penalty": ("presence_penalty",),
    "frequency_penalty": ("frequency_penalty",),
    "repetition_penalty": ("repetition_penalty",),
    "min_tokens": ("min_tokens", "min_length"),
    "stop": ("stop_words", "stop"),
    "n": ("num_return_sequences",),
}
# Fields that change what the model must do, not only how it samples: without a place to put them
# the answer would silently be something else than asked.
_NEEDS_JSON = {"structured_outputs": "guided decoding (response_format, structured_outputs, a forced tool call)",
               "logprobs": "logprobs", "prompt_logprobs": "the prompt's logprobs (`echo` with `logprobs`)",
               "lora_name": "a LoRA adapter", "stop_token_ids": "`stop_token_ids`", "bad_words": "`bad_words`",
               "allowed_token_ids": "`allowed_token_ids`", "priority": "a scheduling `priority`"}


@dataclass(frozen=True, slots=True)
class Contract:
    """What the model's signature says about taking a generation request."""

    decoupled: bool  # streams responses; otherwise one answer to each request (plain infer)
    sampling_json: bool  # takes ``sampling_parameters``; otherwise one input per field
    counts_tokens: bool  # answers with ``num_input_tokens`` / ``num_output_tokens``


def contract_of(sig: ModelSignature) -> Contract | None:
    """The model's generation contract, or None for a model that is not generative."""
    text_in, text_out = sig.inputs.get(TEXT_INPUT), sig.outputs.get(TEXT_OUTPUT)
    if text_in is None or text_in.datatype != "BYTES" or text_out is None or text_out.datatype != "BYTES":
        return None
    sampling = sig.inputs.get(SAMPLING_INPUT)
    return Contract(decoupled=sig.decoupled,
                    sampling_json=sampling is not None and sampling.datatype == "BYTES",
                    counts_tokens=all(name in sig.outputs for name in COUNT_OUTPUTS))


def tensor_inputs(sig: ModelSignature, params: dict[str, Any], model: str) -> list[InferInput]:
    """The sampling ``params`` as a model without ``sampling_parameters`` takes them: one input each."""
    for name, what in _NEEDS_JSON.items():
        if name in params:
            raise invalid_arg(f"model '{model}' cannot take {what}: it declares no '{SAMPLING_INPUT}' input")
    out = []
    for name, value in params.items():
        if name == "n" and value == 1:
            continue  # one answer is any model's default
        spec = next((sig.inputs[c] for c in TENSOR_FIELDS.get(name, ()) if c in sig.inputs), None)
        if spec is None:
            if name == "n":
                raise invalid_arg(f"model '{model}' answers one choice: it declares no 'num_return_sequences' "
                                  f"or '{SAMPLING_INPUT}' input, so n must be 1")
            continue
        out.append(tensor_input(sig, spec, value))
    return out


def tensor_input(sig: ModelSignature, spec: TensorSpec, value: object) -> InferInput:
    """One request's value (a scalar, or a list: ``stop``) as the input ``spec`` in its datatype."""
    values = value if isinstance(value, list) else [value]
    if spec.datatype == "BYTES":
        data = np.array([str(v).encode() if not isinstance(v, bytes) else v for v in values], dtype=object)
    else:
        data = np.array(values, dtype=numpy_dtype(spec.datatype))
    inner = [1] * max(len(spec.dims) - 1, 0) + [len(values)] if spec.dims else []
    shape = ([1] if sig.max_batch_size > 0 else []) + inner
    return InferInput(spec.name, spec.datatype, shape or [1], data)


def task_refused(error: ConveyorError, task: str) -> bool:
    """Whether ``error`` is the model's refusal of ``task`` ("generate", "embed"): a pooling model asked
    to generate, or a generative one asked for an embedding."""
    if error.status not in (Status.UNSUPPORTED, Status.INTERNAL):
        return False
    found = _TASK_REFUSED.search(error.message)
    return found is not None and found.group(1) == task


def api_refused(api: str) -> ConveyorError:
    """vLLM's server's words for a route its model does not serve (its status is 501 there: the whole
    server lacks the route; here the route serves other models, and naming this one is the client's
    mistake: 400)."""
    return invalid_arg(f"The model does not support {api} API")
