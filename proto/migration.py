"""A generation request moved to another engine when the worker running it dies (docs/LLM.md, "A
stream that survives its worker"): the names ingress, router and worker share for it.

An ingress (OpenAI, HTTP generate, gRPC stream) marks a request it could resume (``RESUMABLE``); the
vLLM backend then adds to each streamed response the token ids it generated since the previous one
(``OUTPUT_IDS``) and, in the first, the prompt's (``PROMPT_IDS``). When the router fails the request
because its worker exited (``ErrorInfo.worker_lost``), the ingress sends it again as the prompt's ids plus
those generated so far, marked ``MIGRATION`` (its how-manieth move), which the router counts for
``/metrics``. The model parameter ``MAX_MIGRATIONS`` bounds how often one request moves; the router gives
it to the ingresses in a vLLM model's signature (``max_migrations``).
"""

from __future__ import annotations

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_text

RESUMABLE = "conveyor_resumable"  # request: send the token ids with each streamed response
MIGRATION = "conveyor_migration"  # request: sent again after its worker died (1 for the first move, ...)
PROMPT_IDS = "conveyor_prompt_ids"  # response: the prompt's token ids (first response only)
OUTPUT_IDS = "conveyor_output_ids"  # response: the token ids generated since the previous response

PARAMETER = "MAX_MIGRATIONS"
DEFAULT_MAX_MIGRATIONS = 1  # one worker's death is survived; a request that kills each engine it reaches is not
# More moves than this is a request that takes its engines down, not bad luck: the parameter refuses it.
MAX_MAX_MIGRATIONS = 16


def max_migrations_of(text: str) -> int:
    """The parameter's value ("" when unset: the default); -1 for one that is not a count up to the limit."""
    if not text:
        return DEFAULT_MAX_MIGRATIONS
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_MAX_MIGRATIONS:
        return -1
    return int(text)


def migration_problem(config: mc.ModelConfig) -> str:
    """Why the config's ``MAX_MIGRATIONS`` cannot be used (the model does not load), or ''."""
    text = parameter_text(config, PARAMETER)
    if max_migrations_of(text) < 0:
        return (f"parameter '{PARAMETER}' must be a number of moves from 0 (off) to {MAX_MAX_MIGRATIONS}, "
                f"got '{text}'")
    return ""
