"""A generation request that survives the death of the worker running it (docs/LLM.md, "A stream that
survives its worker").

A decoupled model's responses go from the worker straight to this ingress, and the router, which fails a
dead worker's requests (``ErrorInfo.worker_lost``: ``WorkerLost`` here), never saw them: so the ingress is
the one that knows how far a stream got, and the one that resumes it. A request is resumable on a vLLM
model whose ``MAX_MIGRATIONS`` is not 0 (``catalog.py``). When its worker dies:

* before any response reached this ingress (a request that does not stream, or a stream not started),
  it is sent again as it was: nothing of it was shown, so any request may;
* after, a stream the engine can continue exactly is sent again as the prompt's token ids followed by
  those generated so far (which the backend adds to each response of a request marked ``RESUMABLE``),
  ``max_tokens`` and ``min_tokens`` less what was generated: greedy decoding then goes on token for
  token as it would have, and vLLM's detokenizer, seeded with the prompt's last tokens, goes on with the
  text. One that cannot (``blocker``) ends with the worker's error and the reason.

Each move counts against ``MAX_MIGRATIONS``; past it the request ends with the error. The client sees
one answer: usage counts the original prompt's tokens and every generated one. A model with no other
engine refuses the moved request (UNAVAILABLE) until its restarted worker has loaded it again: the
request waits for that (``wait_back``), up to ``RETURN_WAIT_S``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from conveyor.ingress.dataplane import InferCall
from conveyor.ingress.openai.catalog import Target
from conveyor.ingress.openai.generation import Step, engine_call
from conveyor.ingress.openai.prompts import Prompt
from conveyor.proto.errors import ConveyorError, Status, WorkerLost
from conveyor.proto.migration import MIGRATION, OUTPUT_IDS, PROMPT_IDS, RESUMABLE

log = logging.getLogger(__name__)

# How long a moved request waits for its model to serve again when no other engine of it is ready (one
# engine: the supervisor restarts its worker, which loads it again: 20-40 s for the tests' tiny Llama on
# two busy cores, about a minute for a large model's weights on a GPU). The client's stream stays open
# meanwhile; past it, the model's refusal is the answer.
RETURN_WAIT_S = 180.0
# Between tries: the first soon (another engine may be ready at once), then no busier than this.
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 2.0


def blocker(params: dict[str, Any]) -> str | None:
    """Why a stream of these sampling parameters (vLLM's names) cannot go on exactly on another engine
    once it has shown text; None when it can."""
    if params.get("n", 1) != 1:
        return "it asks for n > 1 choices"
    if params.get("structured_outputs") is not None:
        return "it uses structured outputs, whose grammar state stays with the engine"
    if params.get("seed") is not None and params.get("temperature") != 0:
        return "it samples with a seed, whose random state stays with the engine"
    if params.get("stop"):
        return "it has stop strings, and the engine holds back text that may begin one"
    if params.get("presence_penalty") or params.get("frequency_penalty"):
        return "its penalties weigh the generated tokens, which would count as prompt on another engine"
    return None


@dataclass(slots=True)
class Resume:
    """One engine request's record for sending it again: what it was, and what came of it so far."""

    target: Target
    prompt: Prompt
    params: dict[str, Any]
    stream: bool
    request_id: str
    limit: int  # MAX_MIGRATIONS
    blocker: str | None  # why it cannot continue once it has answered (None: it can)
    prompt_ids: list[int] | None = None  # the engine's, from its first response
    generated: list[int] = field(default_factory=list)
    answered: bool = False  # a response reached the reader: sending it as it was would repeat it
    moves: int = 0
    prompt_tokens: int | None = None  # the original prompt's count, as the first engine reported it
    cached_tokens: int | None = None
    wait_until: float | None = None  # the monotonic clock's deadline of waiting for the model (wait_back)
    retry_s: float = 0.0

    def observe(self, parameters: dict[str, Any]) -> None:
        """A response arrived: take the token ids out of its parameters (never shown to the client)."""
        self.answered = True
        if not parameters:
            return
        prompt = parameters.pop(PROMPT_IDS, None)
        if prompt is not None and self.prompt_ids is None:
            self.prompt_ids = [int(t) for t in prompt]
        ids = parameters.pop(OUTPUT_IDS, None)
        if ids:
            self.generated += [int(t) for t in ids]

    def adjust(self, step: Step) -> Step:
        """A step as the client's one answer shows it: the prompt is the original's, whichever engine
        (and whatever resumed prompt) answered; the prompt's logprobs came with the first engine's."""
        if self.moves == 0 or not self.generated:
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

    def moved(self, error: WorkerLost) -> InferCall | None:
        """The request to send now that its worker died (``error``), or the error it ends with. None:
        every token it may generate has come (only its last response was lost): it ends there."""
        if self.moves >= self.limit:
            raise WorkerLost(f"{error.message}; not resumed on another engine: it moved {self.moves} time(s) "
                             f"already (MAX_MIGRATIONS {self.limit})")
        if not self.answered:  # nothing shown yet: the same request again
            prompt, params = self.prompt, self.params
        else:
            if self.blocker is not None:
                raise WorkerLost(f"{error.message}; not resumed on another engine: {self.blocker}")
            if self.prompt_ids is None:  # a model that does not return its token ids
                raise WorkerLost(f"{error.message}; not resumed on another engine: its model did not return "
                                 "the token ids")
            rest = self.remaining()
            if rest is None:
                return None
            prompt, params = self.prompt_ids + self.generated, rest
        self.moves += 1
        log.warning("request '%s' of model '%s': %s; sent again (move %d of %d) with %d generated tokens",
                    self.request_id, self.target.model.name, error.message, self.moves, self.limit,
                    len(self.generated))
        call = engine_call(self.target, prompt, params, self.stream, self.request_id)
        call.parameters.update(self.marks())
        call.parameters[MIGRATION] = self.moves
        return call

    async def wait_back(self, error: ConveyorError) -> bool:
        """The moved request was refused before it answered: True, after a pause, when that is its model
        not being served yet (UNAVAILABLE: no engine ready, its only one loading again) and it may try
        again; False for any other refusal or past ``RETURN_WAIT_S``."""
        if self.moves == 0 or error.status != Status.UNAVAILABLE or isinstance(error, WorkerLost):
            return False
        now = time.monotonic()
        if self.wait_until is None:
            self.wait_until = now + RETURN_WAIT_S
            log.warning("request '%s' of model '%s': waiting up to %.0f s for the model to be served again (%s)",
                        self.request_id, self.target.model.name, RETURN_WAIT_S, error.message)
        if now >= self.wait_until:
            return False
        self.retry_s = min(RETRY_MAX_S, self.retry_s * 2 or RETRY_FIRST_S)
        await asyncio.sleep(min(self.retry_s, self.wait_until - now))
        return True

    def remaining(self) -> dict[str, Any] | None:
        """The sampling parameters of the rest of the answer (None: nothing remains to generate)."""
        done = len(self.generated)
        params = {k: v for k, v in self.params.items() if k != "prompt_logprobs"}  # shown with the first
        left = int(params.get("max_tokens") or 0) - done
        if "max_tokens" in params:
            if left <= 0:
                return None
            params["max_tokens"] = left
        if params.get("min_tokens"):
            params["min_tokens"] = max(0, int(params["min_tokens"]) - done)
        return params

    def marks(self) -> dict[str, Any]:
        """The request parameters of a stream that may continue: the backend returns its token ids."""
        return {RESUMABLE: True} if self.stream and self.blocker is None else {}


def plan(target: Target, prompt: Prompt, params: dict[str, Any], stream: bool, call: InferCall) -> Resume | None:
    """``call``'s record for sending it again if its worker dies, marked for its token ids; None when its
    model's requests do not move (``MAX_MIGRATIONS`` 0, or not a vLLM model)."""
    model = target.model
    if model.max_migrations <= 0 or not model.contract.decoupled:
        return None
    resume = Resume(target, prompt, params, stream, call.id, model.max_migrations, blocker(params))
    call.parameters.update(resume.marks())
    return resume
