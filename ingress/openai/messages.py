"""Anthropic's Messages API on the OpenAI ingress: ``POST /v1/messages``, streamed or not, and
``POST /v1/messages/count_tokens``.

A Messages request is read as the chat request it means (``messages_schema.py``) and runs as one
(``chat_translation.py``): the same template, tools, structured outputs, adapters, placement and migration;
only the answer is written in Anthropic's shapes:

* a message: ``{"id": "msg_<request id>", "type": "message", "role": "assistant", "model", "content",
  "stop_reason", "stop_sequence", "usage"}``; ``content`` is the text (a ``text`` block, left out when empty)
  then a ``tool_use`` block per call the model's text holds (``id`` ``toolu_...``, ``name``, ``input``), or
  one empty ``text`` block when there is neither, as Anthropic writes an empty answer;
* ``stop_reason``: ``max_tokens`` when the answer ran out of tokens, else ``tool_use`` when it called
  tools, ``stop_sequence`` (and ``stop_sequence`` the string) when it ended on one of ``stop_sequences``,
  ``end_turn`` otherwise. Which stop string ended it is the engine's to say (the vLLM backend's steps,
  ``proto/stream_steps.py``); a model that does not say ends its turn.
* ``usage``: ``input_tokens`` (the prompt's tokens the engine's prefix cache did not hold),
  ``cache_read_input_tokens`` (those it held, where the engine reports them) and ``output_tokens``;
* a stream, as Anthropic's server-sent events (``event:`` and ``data:`` lines): ``message_start``, ``ping``,
  then per content block ``content_block_start``, its ``content_block_delta``s (``text_delta``, or
  ``input_json_delta`` for a call's arguments, as the model writes them) and ``content_block_stop``, then
  ``message_delta`` (stop reason, usage) and ``message_stop``. A failure after the first event is an
  ``error`` event; a client that goes away cancels the engine's request.

``count_tokens`` writes the prompt as ``/v1/messages`` would and counts it with the model's tokenizer
(``{"input_tokens": N}``), the special tokens the engine adds included.

Errors are Anthropic's (``errors.py``): ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from typing import Any

import falcon
import falcon.asgi
import orjson

from conveyor.ingress.http.body import read_body
from conveyor.ingress.openai.catalog import Catalog
from conveyor.ingress.openai.chat_translation import Event, Pieces, Tally, TranslatedChat
from conveyor.ingress.openai.endpoints import EndpointOptions, Job
from conveyor.ingress.openai.errors import anthropic_doc
from conveyor.ingress.openai.generation import Step, Usage
from conveyor.ingress.openai.messages_schema import CountTokensRequest, MessagesRequest, chat_request
from conveyor.ingress.openai.schema import chat_messages, decode
from conveyor.ingress.openai.tool_parsers.base import CallDelta, CallReader
from conveyor.ingress.openai.tools import plan
from conveyor.proto.errors import ConveyorError, invalid_arg

Request = falcon.asgi.Request
Response = falcon.asgi.Response


PING = Event("ping", {"type": "ping"})
MESSAGE_STOP = Event("message_stop", {"type": "message_stop"})
_EMPTY_TEXT = {"type": "text", "text": ""}


def tool_use_id() -> str:
    """Anthropic's form of a call's id (``toolu_`` and 24 characters)."""
    return f"toolu_{uuid.uuid4().hex[:24]}"


def stop_reason(finish: str | None, called: bool, stop: str | None) -> tuple[str | None, str | None]:
    """``(stop_reason, stop_sequence)`` of an answer that finished for ``finish`` (the engine's), having
    called tools or not, on the stop string ``stop`` (None: none, or not reported). As vLLM's server: running
    out of tokens wins; a call wins over a stop string (``called``: the calls are whole)."""
    if finish == "length":
        return "max_tokens", None
    if finish not in ("stop", "tool_calls"):
        return None, None  # aborted, or a reason Anthropic has no word for
    if called:
        return "tool_use", None
    if stop is not None:
        return "stop_sequence", stop
    return "end_turn", None


def usage_doc(usage: Usage) -> dict[str, Any]:
    """Anthropic's ``usage``: the prompt's tokens split into those read from the engine's prefix cache and the
    rest (Anthropic's ``input_tokens`` are the tokens not read from a cache), and the answer's."""
    cached = usage.cached_tokens
    doc: dict[str, Any] = {"input_tokens": max(usage.prompt_tokens - (cached or 0), 0),
                           "output_tokens": usage.completion_tokens}
    if cached is not None:
        doc["cache_read_input_tokens"] = cached
    return doc


def _arguments(text: str) -> dict[str, Any]:
    """A call's arguments text as ``input`` (an object); arguments cut short by ``max_tokens``, or not an
    object, are an empty one (``stop_reason`` says the answer was cut)."""
    try:
        value = orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class Messages(TranslatedChat):
    """``POST /v1/messages``."""

    api = "Messages"  # vLLM's words when the model does not generate: "The model does not support Messages API"
    id_prefix = "msg_"

    async def on_post(self, req: Request, resp: Response) -> None:
        request = await self._body(req, resp, MessagesRequest)
        whole = await self._run(req, resp, chat_request(request), request.stream, message_events)
        if whole is None:
            return
        content: list[dict[str, Any]] = [{"type": "text", "text": whole.content}] if whole.content else []
        content += [{"type": "tool_use", "id": tool_use_id(), "name": call.name, "input": _arguments(call.arguments)}
                    for call in whole.calls]
        reason, sequence = stop_reason(whole.tally.finish, bool(whole.calls), whole.tally.stop)
        job = whole.job
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps({"id": job.id, "type": "message", "role": "assistant", "model": job.model,
                                  "content": content or [_EMPTY_TEXT], "stop_reason": reason,
                                  "stop_sequence": sequence, "usage": usage_doc(whole.tally.usage)})


async def message_events(job: Job, first: Step,
                         rest: AsyncGenerator[Step, None]) -> AsyncGenerator[falcon.asgi.SSEvent, None]:
    """A streamed answer's events, from its first step (read before the status line) and the rest."""
    tally = Tally()
    blocks = _Blocks(job.tools.reader() if job.tools else None)
    try:
        counted = Usage()
        counted.add(first)
        start = usage_doc(counted)
        start["output_tokens"] = 0  # the answer's tokens come with the deltas; message_delta says how many
        yield Event("message_start", {"type": "message_start", "message": {
            "id": job.id, "type": "message", "role": "assistant", "model": job.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": start}})
        yield PING
        step: Step | None = first
        while step is not None:
            for event in blocks.feed(tally.add(step)):
                yield event
            step = await anext(rest, None)
        for event in blocks.end():
            yield event
        reason, sequence = stop_reason(tally.finish, blocks.whole_calls(), tally.stop)
        yield Event("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                      "usage": usage_doc(tally.usage)})
        yield MESSAGE_STOP
    except ConveyorError as exc:  # the status line is sent already: the error is an event
        yield Event("error", anthropic_doc(exc))
    finally:
        await rest.aclose()  # ends the model's request if the client went away


class _Blocks(Pieces):
    """The content blocks of one streamed answer: text in a ``text`` block, each call in a ``tool_use`` block of
    its own, its arguments as ``input_json_delta``s."""

    def __init__(self, reader: CallReader | None) -> None:
        super().__init__(reader)
        self._index = -1  # the open block's (or the last one's)
        self._open = ""  # the open block's type; "": none
        self._calls: dict[int, int] = {}  # a call's index -> its block's
        self._arguments = ""  # the last call's arguments so far

    def end(self) -> list[Event]:
        """The text is over: what the reader held back, the last block closed (an empty ``text`` block when
        there was none, as the answer that does not stream has one)."""
        out = self._held()
        if self._index < 0:
            out.append(self._start(dict(_EMPTY_TEXT), "text"))
        return out + self._close()

    def whole_calls(self) -> bool:
        """Whether the answer called tools, its last call's arguments whole (a stop string may cut them)."""
        if not self._calls:
            return False
        try:
            orjson.loads(self._arguments)
        except orjson.JSONDecodeError:
            return False
        return True

    def _texts(self, text: str) -> list[Event]:
        if not text:
            return []
        out = [] if self._open == "text" else [*self._close(), self._start(dict(_EMPTY_TEXT), "text")]
        out.append(Event("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                 "delta": {"type": "text_delta", "text": text}}))
        return out

    def _call(self, delta: CallDelta) -> list[Event]:
        out: list[Event] = []
        if delta.name is not None:  # a new call: its block
            out += self._close()
            out.append(self._start({"type": "tool_use", "id": tool_use_id(), "name": delta.name, "input": {}},
                                   "tool_use"))
            self._calls[delta.index] = self._index
            self._arguments = ""
        if delta.arguments and self._calls.get(delta.index) == self._index and self._open == "tool_use":
            self._arguments += delta.arguments
            out.append(Event("content_block_delta", {
                "type": "content_block_delta", "index": self._index,
                "delta": {"type": "input_json_delta", "partial_json": delta.arguments}}))
        return out

    def _start(self, block: dict[str, Any], kind: str) -> Event:
        self._index += 1
        self._open = kind
        return Event("content_block_start", {"type": "content_block_start", "index": self._index,
                                             "content_block": block})

    def _close(self) -> list[Event]:
        if not self._open:
            return []
        self._open = ""
        return [Event("content_block_stop", {"type": "content_block_stop", "index": self._index})]


class CountTokens:
    """``POST /v1/messages/count_tokens``: the prompt ``/v1/messages`` would write, counted."""

    def __init__(self, catalog: Catalog, options: EndpointOptions) -> None:
        self._catalog = catalog
        self._options = options

    async def on_post(self, req: Request, resp: Response) -> None:
        body = await read_body(req, resp, self._options.max_body_bytes, self._options.max_json_bytes)
        chat = chat_request(decode(body, CountTokensRequest))
        messages = chat_messages(chat)
        target = await self._catalog.target(chat.model)
        model = target.model
        tools = plan(chat, model.tool_parser)
        template = await self._catalog.chat_template(model)
        prompt = template.prompt(messages, tools=tools.template_tools if tools else None)
        tokenizer = await self._catalog.tokenizer(model)
        if tokenizer is None:
            raise invalid_arg(f"model '{model.name}' has no tokenizer to count with (a tokenizer.json in its "
                              "tokenizer folder)")
        # As the prompt's tokens are counted in a Messages answer's usage: by the engine where it counts them
        # (vLLM tokenizes a text prompt with its special tokens), by this tokenizer as a chat prompt otherwise.
        count = tokenizer.count(prompt, add_special_tokens=model.contract.counts_tokens)
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps({"input_tokens": count})
