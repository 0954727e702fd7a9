"""A generation request of a vLLM model that survives the death of the worker running it (docs/LLM.md, "A
stream that survives its worker"): what every ingress that moves requests shares.

A decoupled model's responses go from the worker straight to the ingress, and the router, which fails a
dead worker's requests (``ErrorInfo.worker_lost``: ``WorkerLost`` here), never saw them: so the ingress is
the one that knows how far a stream got, and the one that resumes it. When the worker dies:

* before any response reached the ingress (a request that does not stream, or a stream not started),
  the request is sent again as it was: nothing of it was shown, so any request may;
* after, a stream the engine can continue exactly is sent again as the prompt's token ids followed by
  those generated so far (which the backend adds to each response of a request marked ``RESUMABLE``),
  ``max_tokens`` and ``min_tokens`` less what was generated: greedy decoding then goes on token for
  token as it would have, and vLLM's detokenizer, seeded with the prompt's last tokens, goes on with the
  text. One that cannot (``blocker``) ends with the worker's error and the reason.

Each move counts against ``MAX_MIGRATIONS``; past it the request ends with the error. A model with no
other engine refuses the moved request (UNAVAILABLE) until its restarted worker has loaded it again: the
request waits for that (``Migration.wait_back``), up to ``RETURN_WAIT_S``.

``Migration`` is one request's record; each ingress says how its own request is sent again
(``Migration.call``): the OpenAI one (``openai/migration.py``) from its prompt and sampling parameters,
Triton's generate and ModelStreamInfer (``tensor_migration.py``) from the request's tensors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from conveyor.ingress.dataplane import InferCall
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
# vLLM's ``SamplingParams.max_tokens`` when a request does not say (Triton's generate may not).
VLLM_DEFAULT_MAX_TOKENS = 16
# The constraint of structured outputs, by vLLM's name and by Triton's vllm_backend's (its older one).
_STRUCTURED = ("structured_outputs", "guided_decoding")


def _number(value: Any, default: float) -> float:
    """A sampling parameter's number (request parameters may give it as text); ``default`` when unset,
    NaN when it is no number (the engine refuses it anyway)."""
    if value is None:
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def blocker(params: dict[str, Any]) -> str | None:
    """Why a stream of these sampling parameters (vLLM's names) cannot go on exactly on another engine
    once it has shown text; None when it can."""
    if _number(params.get("n"), 1) != 1:
        return "it asks for n > 1 choices"
    if any(params.get(key) is not None for key in _STRUCTURED):
        return "it uses structured outputs, whose grammar state stays with the engine"
    if params.get("seed") is not None and _number(params.get("temperature"), 1) != 0:
        return "it samples with a seed, whose random state stays with the engine"
    if params.get("stop"):
        return "it has stop strings, and the engine holds back text that may begin one"
    if _number(params.get("presence_penalty"), 0) or _number(params.get("frequency_penalty"), 0):
        return "its penalties weigh the generated tokens, which would count as prompt on another engine"
    if params.get("bad_words"):
        return "its bad words match the generated tokens, which would count as prompt on another engine"
    if params.get("truncate_prompt_tokens") is not None:
        return "it truncates its prompt, which would cut the generated tokens on another engine"
    return None


class Migration:
    """One engine request's record for sending it again: what it was, and what came of it so far."""

    __slots__ = ("answered", "blocker", "generated", "limit", "model", "moves", "params", "prompt_ids",
                 "request_id", "resumed", "retry_s", "sent", "session", "stream", "wait_until")

    def __init__(self, model: str, request_id: str, params: dict[str, Any], stream: bool, limit: int) -> None:
        self.model = model
        self.request_id = request_id
        self.params = params  # the sampling parameters, vLLM's names
        self.stream = stream
        self.limit = limit  # MAX_MIGRATIONS
        self.blocker = blocker(params)  # why it cannot continue once it has answered (None: it can)
        self.session = 0  # the call's session key's hash: a moved request stays in its session
        self.prompt_ids: list[int] | None = None  # the engine's, from its first response
        self.generated: list[int] = []
        self.answered = False  # a response reached the reader: sending it as it was would repeat it
        self.moves = 0
        # Sent again as token ids: the engine answering now goes on from an earlier one's tokens, and its
        # prompt holds them (it is not the client's).
        self.resumed = False
        self.wait_until: float | None = None  # the monotonic clock's deadline of waiting for the model
        self.retry_s = 0.0
        self.sent: tuple[list[int] | None, dict[str, Any]] | None = None  # what the last move sent (``call``'s)

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

    def call(self, prompt_ids: list[int] | None, params: dict[str, Any]) -> InferCall:
        """The engine request again: as it was (``prompt_ids`` None), or from these token ids with these
        sampling parameters. Each ingress's own."""
        raise NotImplementedError

    def moved(self, error: WorkerLost) -> InferCall | None:
        """The request to send now that its worker died (``error``), or the error it ends with. None:
        every token it may generate has come (only its last response was lost): it ends there."""
        if self.moves >= self.limit:
            raise WorkerLost(f"{error.message}; not resumed on another engine: it moved {self.moves} time(s) "
                             f"already (MAX_MIGRATIONS {self.limit})")
        if not self.answered:  # nothing shown yet: the same request again
            self.sent = (None, self.params)
        else:
            if self.blocker is not None:
                raise WorkerLost(f"{error.message}; not resumed on another engine: {self.blocker}")
            if self.prompt_ids is None:  # a model that does not return its token ids
                raise WorkerLost(f"{error.message}; not resumed on another engine: its model did not return "
                                 "the token ids")
            rest = self.remaining()
            if rest is None:
                return None
            self.sent = (self.prompt_ids + self.generated, rest)
            self.resumed = True
        self.moves += 1
        log.warning("request '%s' of model '%s': %s; sent again (move %d of %d) with %d generated tokens",
                    self.request_id or "<id_unknown>", self.model, error.message, self.moves, self.limit,
                    len(self.generated))
        return self.again()

    def again(self) -> InferCall:
        """The last move's request, made anew: to send it once more after its model refused it (``wait_back``).
        Not the call sent already: the data plane turned its BYTES inputs into their wire form as it sent it."""
        assert self.sent is not None, "no move yet"
        call = self.call(*self.sent)
        call.parameters.update(self.marks())
        call.parameters[MIGRATION] = self.moves  # the router counts it (conveyor_request_migrations_total)
        call.session = self.session
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
                        self.request_id or "<id_unknown>", self.model, RETURN_WAIT_S, error.message)
        if now >= self.wait_until:
            return False
        self.retry_s = min(RETRY_MAX_S, self.retry_s * 2 or RETRY_FIRST_S)
        await asyncio.sleep(min(self.retry_s, self.wait_until - now))
        return True

    def remaining(self) -> dict[str, Any] | None:
        """The sampling parameters of the rest of the answer (None: nothing remains to generate). Without
        ``max_tokens`` the engine's default bounds the whole answer; ``null`` (the context's room) stays."""
        done = len(self.generated)
        params = {k: v for k, v in self.params.items() if k != "prompt_logprobs"}  # shown with the first
        bound = params.get("max_tokens", VLLM_DEFAULT_MAX_TOKENS)
        if bound is not None:
            left = int(bound) - done
            if left <= 0:
                return None
            params["max_tokens"] = left
        if params.get("min_tokens"):
            params["min_tokens"] = max(0, int(params["min_tokens"]) - done)
        return params

    def marks(self) -> dict[str, Any]:
        """The request parameters of a stream that may continue: the backend returns its token ids."""
        return {RESUMABLE: True} if self.stream and self.blocker is None else {}
