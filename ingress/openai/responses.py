"""OpenAI's Responses API on the OpenAI ingress: ``POST /v1/responses`` (streamed or not), ``GET`` and
``DELETE /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``.

A Responses request is read as the chat request it means (``responses_schema.py``), after the stored
conversation its ``previous_response_id`` names, and runs as one (``chat_translation.py``): the same template,
tools, structured outputs, adapters, placement and migration; only the answer is written in the Responses API's
shapes (those the official ``openai`` client parses, ``openai.types.responses``):

* a response: ``{"id": "resp_...", "object": "response", "created_at", "status", "model", "output", "usage",
  ...}`` echoing the request's settings; ``output`` is a ``message`` item (its text as one ``output_text``
  part, left out when the model only called tools) then a ``function_call`` item per call its text holds
  (``call_id`` ``call_...``, ``name``, ``arguments``). ``status`` is ``completed``, or ``incomplete`` with
  ``incomplete_details.reason`` ``max_output_tokens`` when the answer ran out of tokens.
* ``usage``: ``input_tokens`` (``input_tokens_details.cached_tokens``: those the engine's prefix cache held, where
  it reports them), ``output_tokens``, ``total_tokens``.
* a stream, as OpenAI's server-sent events (``event:`` and ``data:`` lines, each with its ``sequence_number``):
  ``response.created``, ``response.in_progress``, then per output item ``response.output_item.added``, its
  content (a message: ``response.content_part.added``, ``response.output_text.delta``s,
  ``response.output_text.done``, ``response.content_part.done``; a call:
  ``response.function_call_arguments.delta``s and ``.done``) and ``response.output_item.done``, then
  ``response.completed`` (or ``response.incomplete``) with the whole response. A failure after the first
  event is an ``error`` event; a client that goes away cancels the engine's request.

``store`` (default true) keeps the response and its conversation in the group's store (``response_store.py``),
where every ingress process of the group finds it, before the answer (or the stream's last event) is sent: a
follow-up may come at once, through any ingress process. A follow-up keeps the conversation's session, so that
it is placed on the engine that holds its prefix (router/scheduling/engine_placement.py), as any request
of that session. Responses run while their request is open (no ``background``), so none can be cancelled: a
stored one's ``cancel`` is vLLM's 400, an unknown id OpenAI's 404.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

import falcon
import falcon.asgi
import msgspec
import orjson

from conveyor.ingress.dataplane import DataPlane
from conveyor.ingress.openai.catalog import Catalog
from conveyor.ingress.openai.chat_translation import Event, Pieces, Tally, TranslatedChat
from conveyor.ingress.openai.endpoints import EndpointOptions, Job
from conveyor.ingress.openai.errors import UnknownResponse, error_doc
from conveyor.ingress.openai.generation import Step, Usage
from conveyor.ingress.openai.response_store import ResponseStore, StoredResponse
from conveyor.ingress.openai.responses_schema import ResponsesRequest, chat_request, check, conversation
from conveyor.ingress.openai.schema import CalledFunction, ChatMessage, ChatRequest, MessageToolCall
from conveyor.ingress.openai.tool_parsers.base import CallDelta, CallReader
from conveyor.proto.errors import ConveyorError, invalid_arg
from conveyor.proto.prefix_keys import SESSION_HEADER

Request = falcon.asgi.Request
Response = falcon.asgi.Response

_HISTORY = msgspec.json.Decoder(list[ChatMessage])
_ENCODE = msgspec.json.Encoder()


def _new_id(prefix: str) -> str:
    """A fresh id: random, never the client's request id (a chosen id must not name another's response)."""
    return f"{prefix}{uuid.uuid4().hex}"


def usage_doc(usage: Usage) -> dict[str, Any] | None:
    if not usage.counted:
        return None  # the model reports no counts and has no tokenizer: none, as chat's
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens or 0},
            "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


def _dropped_none(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if v is not None}


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [_text_part(text)]}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


class Answer:
    """One response on its way: the request's echo, and what the model said."""

    def __init__(self, request: ResponsesRequest, chat: ChatRequest, response_id: str) -> None:
        self.request = request
        self.chat = chat
        self.id = response_id
        self.created = time.time()

    def doc(self, output: list[dict[str, Any]], usage: Usage | None, finish: str | None,
            status: str | None = None) -> dict[str, Any]:
        req = self.request
        incomplete = finish == "length"
        choice = req.tool_choice
        fmt = req.text.format if req.text is not None else None
        return {
            "id": self.id, "object": "response", "created_at": int(self.created),
            "status": status or ("incomplete" if incomplete else "completed"), "background": False, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "max_tool_calls": None,
            "model": req.model, "output": output,
            "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id, "prompt_cache_key": req.prompt_cache_key,
            "reasoning": None, "service_tier": "default", "store": req.store,
            "temperature": req.temperature, "top_p": req.top_p,
            "text": {"format": _dropped_none(msgspec.to_builtins(fmt)) if fmt is not None else {"type": "text"}},
            "tool_choice": (choice if isinstance(choice, str) else _dropped_none(msgspec.to_builtins(choice)))
            if choice is not None else "auto",
            "tools": [_dropped_none(msgspec.to_builtins(t)) for t in req.tools or ()],
            "truncation": req.truncation or "disabled", "usage": usage_doc(usage) if usage is not None else None,
            "user": req.user, "metadata": req.metadata or {},
        }

    def record(self, doc: dict[str, Any], output: list[dict[str, Any]]) -> StoredResponse:
        """What the store keeps: the response, and its conversation with the answer as the assistant's turn."""
        text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
        calls = [MessageToolCall(CalledFunction(item["name"], item["arguments"]), item["call_id"])
                 for item in output if item["type"] == "function_call"]
        turns = [*conversation(self.chat), ChatMessage("assistant", text, tool_calls=calls or None)]
        return StoredResponse(self.id, self.created, orjson.dumps(doc), _ENCODE.encode(turns),
                              self.chat.prompt_cache_key or self.id)


class Responses(TranslatedChat):
    """``POST /v1/responses``."""

    api = "Responses"  # vLLM's words when the model does not generate
    id_prefix = "resp_"

    def __init__(self, dataplane: DataPlane, catalog: Catalog, options: EndpointOptions,
                 store: ResponseStore) -> None:
        super().__init__(dataplane, catalog, options)
        self._store = store

    async def on_post(self, req: Request, resp: Response) -> None:
        request = await self._body(req, resp, ResponsesRequest)
        check(request)
        history: list[ChatMessage] = []
        session: str | None = None
        if request.previous_response_id is not None:
            previous = await self._store.get(request.previous_response_id)
            if previous is None:
                raise UnknownResponse(request.previous_response_id, "previous_response_id")
            history = _HISTORY.decode(previous.conversation)
            session = previous.session  # the conversation's engine
        response_id = _new_id("resp_")
        # The conversation's session, kept with it: its follow-ups go where its prefix is, whoever names none.
        session = req.get_header(SESSION_HEADER) or request.prompt_cache_key or session or response_id
        chat = chat_request(request, history, session)
        answer = Answer(request, chat, response_id)
        whole = await self._run(req, resp, chat, request.stream,
                                lambda job, first, rest: response_events(answer, job, first, rest, self._store))
        if whole is None:
            return
        finish = whole.tally.finish
        status = "incomplete" if finish == "length" else "completed"
        output = [] if whole.calls and not whole.content else [message_item(_new_id("msg_"), whole.content, status)]
        output += [call_item(_new_id("fc_"), _new_id("call_"), call.name, call.arguments, "completed")
                   for call in whole.calls]
        doc = answer.doc(output, whole.tally.usage, finish)
        if request.store:
            await self._store.put(answer.record(doc, output))
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps(doc)


async def response_events(answer: Answer, job: Job, first: Step, rest: AsyncGenerator[Step, None],
                          store: ResponseStore) -> AsyncGenerator[falcon.asgi.SSEvent, None]:
    """A streamed response's events, from its first step (read before the status line) and the rest."""
    tally = Tally()
    items = _Items(job.tools.reader() if job.tools else None)
    try:
        yield items.event({"type": "response.created", "response": answer.doc([], None, None, "in_progress")})
        yield items.event({"type": "response.in_progress",
                           "response": answer.doc([], None, None, "in_progress")})
        step: Step | None = first
        while step is not None:
            for event in items.feed(tally.add(step)):
                yield event
            step = await anext(rest, None)
        for event in items.end("incomplete" if tally.finish == "length" else "completed"):
            yield event
        doc = answer.doc(items.output, tally.usage, tally.finish)
        if answer.request.store:  # before the last event: a follow-up may come as soon as it is read
            await store.put(answer.record(doc, items.output))
        yield items.event({"type": f"response.{doc['status']}", "response": doc})
    except ConveyorError as exc:  # the status line is sent already: the error is an event
        error = error_doc(exc)["error"]
        yield items.event({"type": "error", "code": str(error["code"]), "message": error["message"],
                           "param": error["param"]})
    finally:
        await rest.aclose()  # ends the model's request if the client went away


class _Items(Pieces):
    """The output items of one streamed response: text in a ``message`` item, each call in a ``function_call``
    item of its own, its arguments as deltas."""

    def __init__(self, reader: CallReader | None) -> None:
        super().__init__(reader)
        self._sequence = 0
        self.output: list[dict[str, Any]] = []  # the items, each whole once closed
        self._open = ""  # the open item's type; "": none
        self._text = ""  # the open message's text so far
        self._calls: dict[int, int] = {}  # a call's index -> its item's

    def event(self, doc: dict[str, Any]) -> Event:
        doc["sequence_number"] = self._sequence
        self._sequence += 1
        return Event(doc["type"], doc)

    def end(self, status: str) -> list[Event]:
        """The text is over: what the reader held back, the last item closed (an empty message when there was
        no item, as the response that does not stream has one)."""
        out = self._held()
        if not self.output:
            out += self._open_message()
        return out + self._close(status)

    def _texts(self, text: str) -> list[Event]:
        if not text:
            return []
        out = [] if self._open == "message" else [*self._close("completed"), *self._open_message()]
        self._text += text
        index = len(self.output) - 1
        out.append(self.event({"type": "response.output_text.delta", "item_id": self.output[index]["id"],
                               "output_index": index, "content_index": 0, "delta": text, "logprobs": []}))
        return out

    def _open_message(self) -> list[Event]:
        item = message_item(_new_id("msg_"), "", "in_progress")
        item["content"] = []
        self.output.append(item)
        self._open = "message"
        self._text = ""
        index = len(self.output) - 1
        return [self.event({"type": "response.output_item.added", "output_index": index, "item": dict(item)}),
                self.event({"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
                            "content_index": 0, "part": _text_part("")})]

    def _call(self, delta: CallDelta) -> list[Event]:
        out: list[Event] = []
        if delta.name is not None:  # a new call: its item
            out += self._close("completed")
            item = call_item(_new_id("fc_"), _new_id("call_"), delta.name, "", "in_progress")
            self.output.append(item)
            self._open = "function_call"
            self._calls[delta.index] = len(self.output) - 1
            out.append(self.event({"type": "response.output_item.added", "output_index": len(self.output) - 1,
                                   "item": dict(item)}))
        index = self._calls.get(delta.index)
        if delta.arguments and index == len(self.output) - 1 and self._open == "function_call":
            item = self.output[index]
            item["arguments"] += delta.arguments
            out.append(self.event({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                                   "output_index": index, "delta": delta.arguments}))
        return out

    def _close(self, status: str) -> list[Event]:
        if not self._open:
            return []
        index = len(self.output) - 1
        item = self.output[index]
        out: list[Event] = []
        if self._open == "message":
            part = _text_part(self._text)
            out += [self.event({"type": "response.output_text.done", "item_id": item["id"], "output_index": index,
                                "content_index": 0, "text": self._text, "logprobs": []}),
                    self.event({"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                                "content_index": 0, "part": part})]
            item["content"] = [part]
        else:
            out.append(self.event({"type": "response.function_call_arguments.done", "item_id": item["id"],
                                   "output_index": index, "name": item["name"], "arguments": item["arguments"]}))
        item["status"] = status
        out.append(self.event({"type": "response.output_item.done", "output_index": index, "item": item}))
        self._open = ""
        return out


class StoredResponses:
    """``GET`` and ``DELETE /v1/responses/{response_id}``."""

    def __init__(self, store: ResponseStore) -> None:
        self._store = store

    async def on_get(self, req: Request, resp: Response, response_id: str) -> None:
        if req.get_param_as_bool("stream"):
            raise invalid_arg("`stream` is not supported: a stored response is whole (no background responses)")
        record = await self._store.get(response_id)
        if record is None:
            raise UnknownResponse(response_id, "response_id")
        resp.content_type = falcon.MEDIA_JSON
        resp.data = record.response

    async def on_delete(self, req: Request, resp: Response, response_id: str) -> None:
        if not await self._store.delete(response_id):
            raise UnknownResponse(response_id, "response_id")
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps({"id": response_id, "object": "response", "deleted": True})


class CancelResponse:
    """``POST /v1/responses/{response_id}/cancel``: only a background response can be, and none is."""

    def __init__(self, store: ResponseStore) -> None:
        self._store = store

    async def on_post(self, req: Request, resp: Response, response_id: str) -> None:
        if await self._store.get(response_id) is None:
            raise UnknownResponse(response_id, "response_id")
        raise invalid_arg("Cannot cancel a synchronous response.")  # vLLM's words
