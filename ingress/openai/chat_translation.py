"""What the routes that speak another API over the chat path share: OpenAI's Responses (``responses.py``) and
Anthropic's Messages (``messages.py``). Each reads its body as the chat request it means (``responses_schema.py``,
``messages_schema.py``: the parts they share in ``translated_request.py``) and runs it as one
(``ChatCompletions._prepare`` and ``_start``): the same template, tools, structured outputs, adapters,
placement and migration. Here is the running: the answer collected whole, its text split into content and the
calls its tool parser reads; or streamed, the status line held until the model's first answer (an error before
it is a plain 4xx/5xx) and each step's text fed to the route's own events (``Pieces``). Each route writes the
answer in its own API's shapes.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import falcon.asgi
import msgspec
import orjson

from conveyor.ingress.http.body import read_body
from conveyor.ingress.openai import load_report
from conveyor.ingress.openai.endpoints import ChatCompletions, Job
from conveyor.ingress.openai.generation import Step, Usage
from conveyor.ingress.openai.load_report import asked_format
from conveyor.ingress.openai.schema import ChatRequest, decode
from conveyor.ingress.openai.tool_parsers.base import CallDelta, CallReader, ToolCall, read_whole

Request = falcon.asgi.Request
Response = falcon.asgi.Response

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"

# A streamed answer's events, from its job, its first step (read before the status line) and the rest.
Events = Callable[[Job, Step, AsyncGenerator[Step, None]], AsyncGenerator[falcon.asgi.SSEvent, None]]


class Event(falcon.asgi.SSEvent):
    """One server-sent event (``event:`` and ``data:`` lines), its wire form made once (``endpoints.Chunk``)."""

    __slots__ = ("_wire",)

    def __init__(self, name: str, doc: dict[str, Any]) -> None:  # no super().__init__: serialize() is all falcon reads
        self._wire = b"event: " + name.encode() + b"\ndata: " + orjson.dumps(doc) + b"\n\n"

    def serialize(self, handler: Any = None) -> bytes:
        return self._wire


class Tally:
    """What an answer's steps have said so far (one choice: a step's lists hold one element): the tokens
    counted, the engine's finish reason and the stop string it ended on (None: none, or not reported)."""

    __slots__ = ("finish", "stop", "usage")

    def __init__(self) -> None:
        self.usage = Usage()
        self.finish: str | None = None
        self.stop: str | None = None

    def add(self, step: Step) -> str:
        """Counts ``step`` in; its text."""
        self.usage.add(step)
        self.finish = (step.finish[0] if step.finish else None) or self.finish
        self.stop = (step.stops[0] if step.stops else None) or self.stop
        return step.texts[0] if step.texts else ""


@dataclass(slots=True)
class Whole:
    """A whole (not streamed) answer: its content (the text, less the calls its tool parser read) and calls."""

    job: Job
    content: str
    calls: list[ToolCall]
    tally: Tally


class TranslatedChat(ChatCompletions):
    """A route whose request is read as a chat request and runs as one; only its answer is its own."""

    async def _body(self, req: Request, resp: Response, kind: type[msgspec.Struct]) -> Any:
        """The request's body, decoded as ``kind``, once the group takes new requests."""
        body = await read_body(req, resp, self._options.max_body_bytes, self._options.max_json_bytes)
        self._dataplane.drain.admit()
        return decode(body, kind)

    async def _run(self, req: Request, resp: Response, chat: ChatRequest, stream: bool,
                   events: Events) -> Whole | None:
        """Runs ``chat``. Streamed: the response's body is ``events``, and None. Else the whole answer."""
        parsed = await self._prepare(chat)
        job, found = await self._start(req, parsed)
        report = asked_format(req.get_header(load_report.FORMAT_HEADER))
        if stream:
            # The status line waits for the model's first answer: an error before it is a plain 4xx/5xx.
            first = await anext(found)
            if report:
                await self._load_report(resp, report, parsed.target.model.name)
            resp.content_type = SSE_CONTENT_TYPE
            resp.sse = events(job, first, found)
            return None
        text = ""
        tally = Tally()
        async for step in found:
            text += tally.add(step)
        if report:
            await self._load_report(resp, report, parsed.target.model.name)
        reader = job.tools.reader() if job.tools is not None else None
        if reader is None or job.tools is None:
            return Whole(job, text, [], tally)
        answer = read_whole(reader, text, job.tools.mode)
        return Whole(job, answer.content or "", answer.calls, tally)


class Pieces:
    """The parts of one streamed answer (Responses' output items, Messages' content blocks), opened and closed
    as its text and calls come: what the tool parser (``reader``; None: the request has no tools) reads as
    content goes to ``_texts``, each call's delta to ``_call``; each returns the events it makes."""

    def __init__(self, reader: CallReader | None) -> None:
        self._reader = reader

    def feed(self, text: str) -> list[Event]:
        if self._reader is None:
            return self._texts(text)
        piece = self._reader.feed(text)
        return self._texts(piece.content) + [e for call in piece.calls for e in self._call(call)]

    def _held(self) -> list[Event]:
        """The text is over: the events of what the reader held back."""
        if self._reader is None:
            return []
        tail = self._reader.end()
        return self._texts(tail.content) + [e for call in tail.calls for e in self._call(call)]

    def _texts(self, text: str) -> list[Event]:
        raise NotImplementedError

    def _call(self, delta: CallDelta) -> list[Event]:
        raise NotImplementedError
