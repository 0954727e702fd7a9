"""Config completion for vLLM models (``backend: "vllm"``), as Triton's vllm_backend does it.

Triton's sample ``config.pbtxt`` names only the backend and the instance group: the backend's
``auto_complete_config`` adds its inputs and outputs (those the config does not declare already),
makes the model decoupled (the engine streams, and takes requests while others run) and turns
batching off (the engine batches per iteration). Done here, without importing vLLM.
"""

from __future__ import annotations

from conveyor.proto import model_config_pb2 as mc

_S, _B = mc.TYPE_STRING, mc.TYPE_BOOL
# (name, type, dims, optional), in Triton's order (vllm_backend src/model.py).
INPUTS = (
    ("text_input", _S, [1], False),
    ("image", _S, [-1], True),
    ("stream", _B, [1], True),
    ("sampling_parameters", _S, [1], True),
    ("exclude_input_in_output", _B, [1], True),
    ("return_finish_reason", _B, [1], True),
    ("return_cumulative_logprob", _B, [1], True),
    ("return_logprobs", _B, [1], True),
    ("return_num_input_tokens", _B, [1], True),
    ("return_num_output_tokens", _B, [1], True),
    ("embedding_request", _S, [1], True),
    # Conveyor's, after Triton's: a prompt of token ids, and the prompt's logprobs (the OpenAI ingress's
    # token-id prompts and ``echo`` with ``logprobs``)
    ("input_ids", mc.TYPE_INT32, [-1], True),
    ("return_prompt_logprobs", _B, [1], True),
    ("return_num_cached_tokens", _B, [1], True),  # the prompt's tokens the prefix cache held (OpenAI usage)
)
OUTPUTS = (
    ("text_output", _S, [-1]),
    ("finish_reason", _S, [-1]),
    ("cumulative_logprob", mc.TYPE_FP32, [-1]),
    ("logprobs", _S, [-1]),
    ("num_input_tokens", mc.TYPE_UINT32, [1]),
    ("num_output_tokens", mc.TYPE_UINT32, [-1]),
    ("prompt_logprobs", _S, [1]),
    ("num_cached_tokens", mc.TYPE_UINT32, [1]),
)


def complete_vllm(config: mc.ModelConfig) -> None:
    """Add the missing inputs and outputs, decoupled, no batching."""
    have = {t.name for t in config.input}
    for name, dtype, dims, optional in INPUTS:
        if name not in have:
            config.input.add(name=name, data_type=dtype, dims=dims, optional=optional)
    have = {t.name for t in config.output}
    for name, dtype, dims in OUTPUTS:
        if name not in have:
            config.output.add(name=name, data_type=dtype, dims=dims)
    config.model_transaction_policy.decoupled = True
    config.max_batch_size = 0
