"""``POST /v1/completions`` and ``POST /v1/chat/completions``, streamed (Server-Sent
Events ending with ``data: [DONE]``) or not, in OpenAI's response shapes.

Both endpoints are one flow: decode the body, resolve the model (and adapter),
write the prompt (chat: the model's template), run one engine request for all
``n`` choices of each prompt (completions take several prompts, text or token ids:
``prompts.py``), and render their steps as one response or as chunks. A chat request with
tools reads each choice's text as content and tool calls (``tools.py``). What a client counts or sizes
(``n``, prompts, stop strings, messages, tools, schemas) is checked against ``proto/llm_limits.py`` right
after the body is decoded, before anything is allocated per choice, prompt or message.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import falcon
import falcon.asgi
import orjson

from conveyor.ingress.dataplane import DataPlane
from conveyor.ingress.http.body import read_body
from conveyor.ingress.openai import load_report, media, migration
from conveyor.ingress.openai.catalog import Catalog, Target
from conveyor.ingress.openai.errors import error_doc
from conveyor.ingress.openai.forms import OPENAI, TRITON
from conveyor.ingress.openai.generation import Step, TokenLogprob, Usage, counted, engine_call, steps
from conveyor.ingress.openai.load_report import asked_format
from conveyor.ingress.openai.media import NO_MEDIA_OPTIONS, MediaOptions
from conveyor.ingress.openai.prompts import Prompt, merged, read_prompts
from conveyor.ingress.openai.request_id import request_id
from conveyor.ingress.openai.schema import (
    ChatRequest,
    CompletionRequest,
    Sampling,
    chat_messages,
    check_completion,
    sampling_parameters,
)
from conveyor.ingress.openai.tool_parsers.base import CallDelta, CallReader, finish_reason, read_whole
from conveyor.ingress.openai.tools import ToolPlan, plan
from conveyor.ingress.openai.triton_schema import decoder, engine_refusals, schema_first
from conveyor.proto import llm_limits
from conveyor.proto.errors import ConveyorError, invalid_arg
from conveyor.proto.prefix_keys import SESSION_HEADER, session_key

MIN_LOGPROB = -9999.0  # vLLM's floor of a logprob it shows (JSON has no -inf)
Request = falcon.asgi.Request
Response = falcon.asgi.Response


class Chunk(falcon.asgi.SSEvent):
    """One server-sent event whose wire form is made once: falcon's ``SSEvent`` keeps six fields and
    decodes and encodes its data again to serialize it, per chunk of every stream."""

    __slots__ = ("_wire",)

    def __init__(self, data: bytes) -> None:  # no super().__init__: serialize() is all falcon reads
        self._wire = b"data: " + data + b"\n\n"

    def serialize(self, handler: Any = None) -> bytes:
        return self._wire


DONE = Chunk(b"[DONE]")


@dataclass(frozen=True, slots=True)
class EndpointOptions:
    max_body_bytes: int
    max_json_bytes: int = 0  # --max-json-bytes: an OpenAI body is JSON whole, bounded plain or inflated
    default_max_tokens: int = 16  # Triton's OpenAI frontend's default
    error_form: str = OPENAI  # --openai-error-form: "triton" decodes within Triton's schema too
    media: MediaOptions = NO_MEDIA_OPTIONS  # where an image_url may point (media.py)


@dataclass(slots=True)
class Job:
    """One request on its way: what the renderers need besides the steps."""

    id: str
    model: str
    created: int
    n: int  # choices over all prompts
    echoes: list[str] | None  # ``echo``: each choice's prompt text, which leads its text
    include_usage: bool
    logprobs: bool  # the answer carries each token's logprob
    continuous_usage: bool  # usage so far on every chunk (vLLM's ``continuous_usage_stats``)
    tools: ToolPlan | None = None  # chat: the answer may call tools


@dataclass(frozen=True, slots=True)
class Parsed:
    """A request body read: what the engine request and the answer are made of."""

    request: Sampling
    params: dict[str, Any]  # the engine's sampling parameters, within proto/llm_limits.py's bounds
    target: Target
    prompts: list[Prompt]
    echoes: list[str] | None = None  # ``echo``: each prompt's text
    tools: ToolPlan | None = None
    images: list[bytes] | None = None  # chat: the ``image_url`` parts' images, base64 (media.py)


class _Endpoint:
    kind: type[Sampling] = Sampling
    chat: bool = False
    api = ""  # vLLM's name of the API, in its refusal when the model does not generate
    id_prefix = ""  # the answer's id: this, then the request's id
    object_name = ""
    chunk_object = ""

    def __init__(self, dataplane: DataPlane, catalog: Catalog, options: EndpointOptions) -> None:
        self._dataplane = dataplane
        self._catalog = catalog
        self._options = options
        self._decode = decoder(options.error_form)
        self._triton = options.error_form == TRITON

    async def on_post(self, req: Request, resp: Response) -> None:
        body = await read_body(req, resp, self._options.max_body_bytes, self._options.max_json_bytes)
        self._dataplane.drain.admit()
        try:
            parsed = await self._parse(body)
        except ConveyorError as exc:
            refusal = schema_first(exc, self.kind, body) if self._triton else exc
            if refusal is exc:
                raise
            raise refusal from None  # Triton's frontend validates the body with its schema before anything else
        request = parsed.request
        job, found = await self._start(req, parsed)
        model = parsed.target.model
        report = asked_format(req.get_header(load_report.FORMAT_HEADER))
        if request.stream:
            # A model that is not decoupled streams too: its one answer is the stream's one chunk.
            # The status line must wait for the model's first answer: an error before it is a plain 4xx/5xx.
            first = await anext(found)
            if report:  # the load as the stream starts (vLLM's server reports on whole answers only)
                await self._load_report(resp, report, model.name)
            resp.content_type = "text/event-stream; charset=utf-8"
            resp.sse = self._events(job, first, found)
            return
        texts = [""] * job.n
        finish: list[str | None] = [None] * job.n
        tokens: list[list[TokenLogprob]] = [[] for _ in range(job.n)]
        usage = Usage()
        async for step in found:
            usage.add(step)
            lo, hi = step.span or (0, job.n)  # the step's lists hold these choices
            for j, text in enumerate(step.texts[: hi - lo]):
                texts[lo + j] += text
                finish[lo + j] = finish[lo + j] or step.finish[j]
            for j, new in enumerate((step.logprobs or [])[: hi - lo]):
                tokens[lo + j] += new
            for j, prompt_tokens in enumerate((step.prompt_logprobs or [])[: hi - lo]):
                if prompt_tokens is not None:  # vLLM: the echoed prompt's tokens lead the choice's
                    tokens[lo + j] = prompt_tokens + tokens[lo + j]
        if report:
            await self._load_report(resp, report, model.name)
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps({
            "id": job.id, "object": self.object_name, "created": job.created, "model": job.model,
            "choices": [self._choice(job, i, (job.echoes[i] if job.echoes else "") + texts[i], finish[i],
                                     self._logprobs(tokens[i], 0) if job.logprobs else None)
                        for i in range(job.n)],
            "usage": usage.wire(), "system_fingerprint": None,
        })

    async def _start(self, req: Request, parsed: Parsed) -> tuple[Job, AsyncGenerator[Step, None]]:
        """The engine requests of a parsed request, on their way: the answer's record and its steps."""
        request, prompts, params = parsed.request, parsed.prompts, parsed.params
        if parsed.tools is not None:
            parsed.tools.apply(params)
        rid = request_id(req, request.request_id)
        # Each prompt its own engine request; several get vLLM's ids for them, the request's and an index.
        calls = [engine_call(parsed.target, prompt, params, request.stream, rid if len(prompts) == 1 else f"{rid}-{i}",
                             parsed.images)
                 for i, prompt in enumerate(prompts)]
        session = req.get_header(SESSION_HEADER) or request.prompt_cache_key
        if session:  # its turns on one engine (router/scheduling/engine_placement.py)
            key = session_key(session)
            for call in calls:
                call.session = key
        options = request.stream_options
        include_usage = bool(options and options.include_usage)
        continuous = bool(include_usage and options and options.continuous_usage_stats)
        top = params.get("logprobs")
        n = request.n
        echoes = None if parsed.echoes is None else [text for text in parsed.echoes for _ in range(n)]
        job = Job(f"{self.id_prefix}{rid}", request.model, int(time.time()),
                  n * len(prompts), echoes, include_usage, top is not None, continuous, parsed.tools)
        model = parsed.target.model
        # Each request marked for being sent again if its worker dies (migration.py).
        # (Not one with images: a resumed prompt of token ids would need them placed again.)
        resumes = [None if parsed.images else migration.plan(parsed.target, prompt, params, request.stream, call)
                   for call, prompt in zip(calls, prompts, strict=True)]
        each = [steps(self._dataplane, call, n, top if isinstance(top, int) else 0, model.contract.decoupled, self.api,
                      resume, join_waiting=model.steps)
                for call, resume in zip(calls, resumes, strict=True)]
        if not model.contract.counts_tokens:
            tokenizer = await self._catalog.tokenizer(model)
            if tokenizer is not None:  # usage from the tokenizer; without one, there is none
                # A chat template writes the special tokens itself (vLLM adds none to a chat prompt).
                each = [counted(found, tokenizer, prompt, add_special_tokens=not self.chat)
                        for found, prompt in zip(each, prompts, strict=True)]
        return job, merged(each, n)

    async def _parse(self, body: bytes) -> Parsed:
        raise NotImplementedError

    async def _load_report(self, resp: Response, fmt: str, model: str) -> None:
        load = await self._dataplane.link.model_load(model)
        resp.set_header(load_report.HEADER, load_report.render(fmt, load))

    def _max_tokens(self, request: Sampling) -> int:
        return request.max_tokens if request.max_tokens is not None else self._options.default_max_tokens

    def _choice(self, job: Job, index: int, text: str, finish: str | None,
                logprobs: dict[str, Any] | None) -> dict[str, Any]:
        raise NotImplementedError

    def _delta(self, index: int, text: str, finish: str | None, first: bool,
               logprobs: dict[str, Any] | None, calls: list[CallDelta]) -> dict[str, Any]:
        raise NotImplementedError

    def _logprobs(self, tokens: list[TokenLogprob], offset: int) -> dict[str, Any]:
        """The ``logprobs`` of a choice's ``tokens``; ``offset``: where the first lies in its text."""
        raise NotImplementedError

    async def _events(
        self, job: Job, first: Step, rest: AsyncGenerator[Step, None],
    ) -> AsyncIterator[falcon.asgi.SSEvent]:
        usage = Usage()
        started = [False] * job.n
        offsets = [0] * job.n  # how much text the tokens of each choice's earlier chunks carried
        # Chat with tools: each choice's text read as content and call deltas as it comes.
        readers: list[CallReader | None] = [job.tools.reader() if job.tools else None for _ in range(job.n)]
        head = {"id": job.id, "object": self.chunk_object, "created": job.created, "model": job.model}
        if job.include_usage:
            head["usage"] = None

        def chunk(step: Step) -> falcon.asgi.SSEvent | None:
            usage.add(step)
            choices = []
            lo, hi = step.span or (0, job.n)  # the step's lists hold these choices: choice i is their i - lo
            for i in range(lo, hi):
                j = i - lo
                text = step.texts[j] if j < len(step.texts) else ""
                reason = step.finish[j] if j < len(step.finish) else None
                echoed: list[TokenLogprob] = []
                if not started[i] and job.echoes:  # vLLM: the prompt, then the choice's first text
                    text = job.echoes[i] + text
                    prompt = step.prompt_logprobs[j] if step.prompt_logprobs and j < len(step.prompt_logprobs) else None
                    echoed = prompt or []
                calls: list[CallDelta] = []
                reader = readers[i]
                if reader is not None:
                    piece = reader.feed(text)
                    text, calls = piece.content, piece.calls
                    if reason is not None:  # the choice's text is over: what the reader held back
                        tail = reader.end()
                        text, calls = text + tail.content, _merged(calls + tail.calls)
                        reason = finish_reason(reader.called, reason)
                # vLLM's: with logprobs, a token without text (after ``</s>`` with ``ignore_eos``, or text a
                # reader holds back) still comes, in a chunk of its own if need be: the stream's logprobs are
                # every token's, as the answer that does not stream.
                tokens: list[TokenLogprob] = []
                if job.logprobs:
                    tokens = echoed + (step.logprobs[j] if step.logprobs and j < len(step.logprobs) else [])
                if text or calls or reason or not started[i] or tokens:
                    logprobs = self._logprobs(tokens, offsets[i]) if job.logprobs else None
                    choices.append(self._delta(i, text, reason, not started[i], logprobs, calls))
                    started[i] = True
                    # vLLM's: the offsets go on by the tokens sent, not by the text (which may lag them), as
                    # the answer that does not stream counts them.
                    offsets[i] += sum(len(t.token) for t in tokens)
            if not choices:
                return None  # the step's tokens count in the next chunk's usage
            doc = {**head, "choices": choices}
            if job.continuous_usage:  # as vLLM: the tokens so far, over every choice here
                doc["usage"] = usage.wire()
            return Chunk(orjson.dumps(doc))

        try:
            event = chunk(first)
            if event is not None:
                yield event
            async for step in rest:
                event = chunk(step)
                if event is not None:
                    yield event
            if job.include_usage:
                yield Chunk(orjson.dumps({**head, "choices": [], "usage": usage.wire()}))
        except ConveyorError as exc:  # the status line is sent already: the error is an event
            yield Chunk(orjson.dumps(error_doc(exc)))
        finally:
            await rest.aclose()  # ends the model's request if the client went away
        yield DONE


def _merged(calls: list[CallDelta]) -> list[CallDelta]:
    """One delta per call in a chunk: a call's pieces from the step and from the reader's end joined."""
    out: list[CallDelta] = []
    for delta in calls:
        if out and out[-1].index == delta.index:
            out[-1].arguments += delta.arguments
        else:
            out.append(delta)
    return out


class Completions(_Endpoint):
    kind = CompletionRequest
    api = "Completions"
    id_prefix = "cmpl-"
    object_name = "text_completion"
    chunk_object = "text_completion"

    async def _parse(self, body: bytes) -> Parsed:
        request = self._decode(body, CompletionRequest)
        check_completion(request)
        if self._triton:
            engine_refusals(request)
        params = sampling_parameters(request, self._max_tokens(request))  # first: n, stop, ... bounded
        prompts = read_prompts(request.prompt, "prompt")
        llm_limits.check_choices(request.n, len(prompts))
        if any(prompt == "" for prompt in prompts):
            raise invalid_arg("prompt must be non-empty")
        target = await self._catalog.target(request.model)
        echoes = [await self._text(target, prompt) for prompt in prompts] if request.echo else None
        return Parsed(request, params, target, prompts, echoes)

    async def _text(self, target: Target, prompt: Prompt) -> str:
        """The text ``echo`` shows of a prompt: token ids decoded as vLLM's server decodes them (its
        tokenizer's ``decode``, special tokens kept)."""
        if isinstance(prompt, str):
            return prompt
        tokenizer = await self._catalog.tokenizer(target.model)
        if tokenizer is None:
            raise invalid_arg(f"`echo` of a prompt of token ids needs the tokenizer of model '{target.model.name}', "
                              "which has none (no tokenizer.json)")
        return tokenizer.decode(prompt)

    def _choice(self, job: Job, index: int, text: str, finish: str | None,
                logprobs: dict[str, Any] | None) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def _delta(self, index: int, text: str, finish: str | None, first: bool,
               logprobs: dict[str, Any] | None, calls: list[CallDelta]) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def _logprobs(self, tokens: list[TokenLogprob], offset: int) -> dict[str, Any]:
        """vLLM's: the alternatives as the engine lists them (the token first), each logprob at least
        -9999 (OpenAI's stand-in for -inf); a prompt's first token has none (null)."""
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t.token)
        return {"tokens": [t.token for t in tokens],
                "token_logprobs": [None if t.logprob is None else max(t.logprob, MIN_LOGPROB) for t in tokens],
                "top_logprobs": [None if t.logprob is None else {tok: max(lp, MIN_LOGPROB) for tok, lp in t.listed}
                                 for t in tokens],
                "text_offset": offsets}


class ChatCompletions(_Endpoint):
    kind = ChatRequest
    chat = True
    api = "Chat Completions"
    id_prefix = "chatcmpl-"
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"

    async def _parse(self, body: bytes) -> Parsed:
        request = self._decode(body, ChatRequest)
        if self._triton:
            engine_refusals(request)
        return await self._prepare(request)

    async def _prepare(self, request: ChatRequest) -> Parsed:
        """A chat request decoded (or made from another API's, ``messages.py``) as the engine request."""
        params = sampling_parameters(request, self._max_tokens(request))  # first: n, stop, ... bounded
        urls: list[str] = []
        messages = chat_messages(request, urls)
        media.count(urls)  # before any is read
        target = await self._catalog.target(request.model)
        tools = plan(request, target.model.tool_parser)
        template = await self._catalog.chat_template(target.model)
        prompt = template.prompt(messages, tools=tools.template_tools if tools else None)
        images = [await media.image_b64(url, self._options.media) for url in urls]
        return Parsed(request, params, target, [prompt], tools=tools, images=images or None)

    def _max_tokens(self, request: Sampling) -> int:
        assert isinstance(request, ChatRequest)
        if request.max_completion_tokens is not None:
            return request.max_completion_tokens
        return super()._max_tokens(request)

    def _choice(self, job: Job, index: int, text: str, finish: str | None,
                logprobs: dict[str, Any] | None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        reader = job.tools.reader() if job.tools else None
        if reader is not None and job.tools is not None:
            answer = read_whole(reader, text, job.tools.mode)
            message["content"] = answer.content
            if answer.calls:
                message["tool_calls"] = [call.wire() for call in answer.calls]
            finish = finish_reason(bool(answer.calls), finish)
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}

    def _delta(self, index: int, text: str, finish: str | None, first: bool,
               logprobs: dict[str, Any] | None, calls: list[CallDelta]) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        if calls:
            delta["content"] = text or None  # as OpenAI's: a chunk of calls alone has no content
            delta["tool_calls"] = [call.wire() for call in calls]
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def _logprobs(self, tokens: list[TokenLogprob], offset: int) -> dict[str, Any]:
        return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode()),
                             "top_logprobs": [{"token": tok, "logprob": lp, "bytes": list(tok.encode())}
                                              for tok, lp in t.top]}
                            for t in tokens], "refusal": None}
