"""An OpenAI request that survives the death of the worker running it (docs/LLM.md, "A stream that
survives its worker"): ``ingress/migration.py`` says when and how a request moves; here, how the OpenAI
ingress sends one again (from its prompt and sampling parameters, ``engine_call``) and how the steps of
the engine that goes on read as the client's one answer. A request is resumable on a vLLM model whose
``MAX_MIGRATIONS`` is not 0 (``catalog.py``). The client sees one answer: usage counts the original
prompt's tokens and every generated one.
"""

from __future__ import annotations

from typing import Any

from conveyor.ingress.dataplane import InferCall
from conveyor.ingress.migration import Migration
from conveyor.ingress.openai.catalog import Target
from conveyor.ingress.openai.generation import Step, engine_call
from conveyor.ingress.openai.prompts import Prompt


class Resume(Migration):
    """One OpenAI engine request's record for sending it again."""

    __slots__ = ("cached_tokens", "prompt", "prompt_tokens", "target")

    def __init__(self, target: Target, prompt: Prompt, params: dict[str, Any], stream: bool, request_id: str,
                 limit: int) -> None:
        super().__init__(target.model.name, request_id, params, stream, limit)
        self.target = target
        self.prompt = prompt
        self.prompt_tokens: int | None = None  # the original prompt's count, as the first engine reported it
        self.cached_tokens: int | None = None

    def call(self, prompt_ids: list[int] | None, params: dict[str, Any]) -> InferCall:
        prompt = self.prompt if prompt_ids is None else prompt_ids
        return engine_call(self.target, prompt, params, self.stream, self.request_id)

    def adjust(self, step: Step) -> Step:
        """A step as the client's one answer shows it: the prompt is the original's, whichever engine
        (and whatever resumed prompt) answered; the prompt's logprobs came with the first engine's."""
        if not self.resumed:
            if step.prompt_tokens is not None:
                self.prompt_tokens = step.prompt_tokens
            if step.cached_tokens is not None:
                self.cached_tokens = step.cached_tokens
            return step
        if step.prompt_tokens is not None:
            step.prompt_tokens = self.prompt_tokens
            step.cached_tokens = self.cached_tokens
        step.prompt_logprobs = None
        return step


def plan(target: Target, prompt: Prompt, params: dict[str, Any], stream: bool, call: InferCall) -> Resume | None:
    """``call``'s record for sending it again if its worker dies, marked for its token ids; None when its
    model's requests do not move (``MAX_MIGRATIONS`` 0, or not a vLLM model)."""
    model = target.model
    if model.max_migrations <= 0 or not model.contract.decoupled:
        return None
    resume = Resume(target, prompt, params, stream, call.id, model.max_migrations)
    call.parameters.update(resume.marks())
    resume.session = call.session
    return resume
