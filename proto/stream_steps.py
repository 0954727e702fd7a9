"""A generation step in a response's parameters: how the vLLM backend answers the OpenAI ingress.

Triton's vLLM contract answers every token with output tensors (``text_output``, ``finish_reason``,
the token counts): each planned and copied into the worker's arena, described, mapped and read
back by the ingress, its release flag written, four or five times per token. The OpenAI ingress
reads a handful of bytes and numbers out of them. So it marks its requests to a vLLM model
(``STEPS``), and the backend then answers each with no tensors and the step in the response's
parameters (``STEP``), which travel in the descriptor itself, as a resumable stream's token ids do
(``proto/migration.py``). Other clients (KServe ``generate``, gRPC) keep Triton's tensors.

``STEP`` is a list, positions below; an entry the request did not ask for (its ``return_*`` input
false) is None. Texts, finish reasons and logprobs have one element per sequence (``n``).
"""

from __future__ import annotations

STEPS = "conveyor_steps"  # request: answer with steps in the parameters, no output tensors
STEP = "conveyor_step"  # response: the step

TEXTS = 0  # list[str]: each sequence's new text
FINISH = 1  # list[str | None] | None: each sequence's finish reason, in the response where it finished
OUTPUT_TOKENS = 2  # int | None: new tokens, over every sequence
PROMPT_TOKENS = 3  # int | None
CACHED_TOKENS = 4  # int | None: the prompt's tokens the engine's prefix cache held
LOGPROBS = 5  # list[str] | None: each sequence's new tokens' logprobs, the backend's JSON ("null": none)
PROMPT_LOGPROBS = 6  # str | None: the prompt's logprobs as JSON, in the first response that has them
# list[str | None] | None: each sequence's stop string, where it finished on one (vLLM's ``stop_reason``, the
# Anthropic ingress's ``stop_sequence``); None when none did. A step from an older backend has no such entry.
STOP_STRINGS = 7
FIELDS = 8
