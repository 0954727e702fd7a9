"""The prompts of one request, as vLLM's server takes them (``/v1/completions``' ``prompt``,
``/v1/embeddings``' ``input``): a string, a list of strings, one prompt's token ids, or a list of
prompts' token ids.

A prompt of token ids reaches a generative model as its ``input_ids`` input (INT32, one element per
id: the name TensorRT-LLM's models give a tokenized prompt), an embedding model in its
``embedding_request`` JSON. Ids are checked here only against what INT32 can carry, in vLLM's words;
the engine checks them against its vocabulary (vLLM's ``Token id N is out of vocabulary``, a 400).

Several prompts are several engine requests, all in flight at once; ``merged`` reads their steps as
one answer whose choices are numbered across prompts, each prompt's ``n`` after the previous one's,
as vLLM's server numbers them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from conveyor.ingress.openai.generation import Step
from conveyor.proto.errors import invalid_arg
from conveyor.proto.llm_limits import MAX_PROMPTS, check_prompts

# What an INT32 ``input_ids`` element carries; any vocabulary is far smaller.
MAX_TOKEN_ID = 2**31 - 1

Prompt = str | list[int]


def read_prompts(value: str | list[Any], field: str, limit: int = MAX_PROMPTS) -> list[Prompt]:
    """The prompts of ``field``: one string, strings, one prompt's token ids, or several prompts' ids; at most
    ``limit`` prompts (vLLM's VLLM_MAX_COMPLETION_PROMPTS: each is an engine request of its own, all in flight
    at once). A list of token ids is one prompt, however long."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise invalid_arg(f"{field} must be non-empty")  # Triton's frontend's words of an empty prompt
    if not _integer(value[0]):
        check_prompts(len(value), field, limit)
    if all(isinstance(v, str) for v in value):
        return list(value)
    if all(_integer(v) for v in value):
        return [_checked(value)]
    if all(isinstance(v, list) and v and all(_integer(t) for t in v) for v in value):
        return [_checked(v) for v in value]
    raise invalid_arg(f"`{field}` must be a string, a list of strings, a list of token ids, or a list of lists of "
                      "token ids")


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked(ids: list[int]) -> list[int]:
    for token in ids:
        if not 0 <= token <= MAX_TOKEN_ID:
            raise invalid_arg(f"Token id {token} is out of vocabulary")  # vLLM's words
    return list(ids)


def merged(streams: list[AsyncGenerator[Step, None]], n: int) -> AsyncGenerator[Step, None]:
    """The steps of several prompts' requests (``n`` choices each) as steps of one answer of
    ``len(streams) * n`` choices, in the order they come, each with the ``span`` of its prompt's choices
    (its lists hold only those: a step costs its own choices, not the whole answer's). ``prompt_tokens`` is
    the sum over the prompts that reported so far (all of them by the last step); ``final`` marks the last
    step only. The first error ends the answer and cancels the other requests; so does closing this iterator
    early."""
    if len(streams) == 1:  # the common case: the one request's own steps, no layer around them
        return streams[0]
    return _merged(streams, n)


async def _merged(streams: list[AsyncGenerator[Step, None]], n: int) -> AsyncGenerator[Step, None]:
    queue: asyncio.Queue[tuple[int, Step | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncGenerator[Step, None]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for step in stream:
                    await queue.put((index, step))
            await queue.put((index, None))
        except Exception as exc:  # the request's error ends the whole answer
            await queue.put((index, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    prompt_tokens: list[int | None] = [None] * len(streams)
    cached_tokens: list[int | None] = [None] * len(streams)
    running = len(streams)
    try:
        while running:
            index, item = await queue.get()
            if item is None:
                running -= 1
                if running == 0:  # the last request ended after its last step: an empty final step
                    yield Step([], [], _sum(prompt_tokens), 0, True, span=(0, 0), cached_tokens=_sum(cached_tokens))
                continue
            if isinstance(item, BaseException):
                raise item
            if item.prompt_tokens is not None:
                prompt_tokens[index] = item.prompt_tokens
            if item.cached_tokens is not None:
                cached_tokens[index] = item.cached_tokens
            placed = _placed(item, index, n, _sum(prompt_tokens))
            placed.cached_tokens = _sum(cached_tokens)
            yield placed
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _sum(counts: list[int | None]) -> int | None:
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


def _placed(step: Step, index: int, n: int, prompt_tokens: int | None) -> Step:
    """``step`` of prompt ``index`` as a step of the whole answer: its choices at ``index * n``."""
    at = index * n
    return Step(
        texts=step.texts[:n], finish=step.finish[:n], prompt_tokens=prompt_tokens, output_tokens=step.output_tokens,
        final=False, logprobs=None if step.logprobs is None else step.logprobs[:n],
        prompt_logprobs=None if step.prompt_logprobs is None else step.prompt_logprobs[:n], span=(at, at + n),
        stops=None if step.stops is None else step.stops[:n],
    )
