"""Plain infer requests served from the HTTP parser's callbacks, without ASGI.

``POST /v2/models/{model}[/versions/{version}]/infer`` is nearly all the HTTP
ingress does under load. For it, uvicorn's ASGI machinery (a scope dict, a
request-response cycle with its event, a task around the app, ``receive`` and
two ``send`` calls checking every header) cost more than the request's own
parsing (docs/PERFORMANCE.md, "HTTP infer without ASGI"). ``FastInferProtocol``
is uvicorn's httptools protocol that takes such a request itself once its
headers are in: it keeps the body's chunks, runs the same ``Infer`` steps
(``parse``, ``answer``) when the message is complete and writes the response
in one write, with the same error rendering (``errors.error_status``) as falcon.
When nothing but the router's answer waits (a templated call to a model whose
signature is cached), not even a task: the request is sent from the parser's
callback and the answer's callback writes the response (``_Awaiting``).

Everything else goes the ASGI way to the falcon app (``BodyLimit`` in front):
other routes and methods, compressed or chunked bodies, bodies over the limit,
``Expect: 100-continue``, duplicated headers that falcon would join, escaped
paths, and a request pipelined behind one still running. Inference restricted or
headers forwarded: the plain protocol, falcon alone (``fast_protocol_class``).
"""

from __future__ import annotations

import re
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import STATUS_LINE
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as UvicornHttpToolsProtocol

from conveyor.ingress.http.app import Infer, InferAnswer
from conveyor.ingress.http.codec import HttpInferRequest, parse_header_length
from conveyor.ingress.http.corked_transport import CorkedTransport
from conveyor.ingress.http.deadline import TIMEOUT_HEADER_BYTES
from conveyor.ingress.http.errors import RETRY_AFTER_LINE, error_body, error_status
from conveyor.ingress.http.protocol import HttpToolsProtocol
from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError

# What falcon's ``{model}`` and ``{version}`` fields match: one non-empty path segment each
# (escaped ones, with a ``%``, are left to falcon, which unescapes them).
INFER_PATH = re.compile(rb"/v2/models/([^/%]+)(?:/versions/([^/%]+))?/infer")

_JSON_TYPE = b"content-type: application/json\r\n"
_CLOSE = b"connection: close\r\n"
# The response headers ``Infer.answer`` names (a handful, all its own), as they go on the wire.
_HEADER_NAMES: dict[str, bytes] = {}
_CONTENT_TYPES: dict[str, bytes] = {}
# uvicorn's default headers (server, date) as head lines, rendered once per list uvicorn makes.
_defaults: object = None
_default_lines = b""


class _Event:
    """What uvicorn's ``connection_lost`` sets on the running cycle; nothing waits on it here."""

    __slots__ = ()

    def set(self) -> None:
        pass


_NO_EVENT = _Event()


class _LookUpFirst(Exception):
    """A refused JSON body of a model this ingress has not looked up: answered after the lookup
    (``Infer.model_first``), off the parse."""

    def __init__(self, refusal: ConveyorError) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


class FastCycle:
    """One plain infer request: its head as read, its body's chunks; the attributes
    uvicorn's protocol reads from a cycle (``response_complete``, ``keep_alive``,
    ``disconnected``, ``message_event``; ``response_started`` for ``protocol.py``) so
    that shutdown, pipelining and a lost connection treat it as one of its own."""

    __slots__ = ("accept_encoding", "chunks", "disconnected", "header_length", "keep_alive", "message_event",
                 "model", "path", "response_complete", "response_started", "timeout", "traceparent", "version")

    def __init__(self, model: str, version: str, path: bytes, keep_alive: bool) -> None:
        self.model = model
        self.version = version
        self.path = path
        self.keep_alive = keep_alive
        self.header_length: str | None = None
        self.accept_encoding: str | None = None
        self.traceparent = ""
        self.timeout: str | None = None  # the client's deadline header (deadline.py)
        self.chunks: list[bytes] = []
        self.response_complete = False
        self.response_started = False  # the answer leaves in one write: started is complete
        self.disconnected = False
        self.message_event = _NO_EVENT

    def body(self) -> bytes:
        chunks = self.chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_HEADERS_READ = frozenset((b"content-length", b"inference-header-content-length", b"accept-encoding", b"traceparent",
                           TIMEOUT_HEADER_BYTES, b"transfer-encoding", b"content-encoding", b"expect"))


def _read_headers(cycle: FastCycle, headers: list[tuple[bytes, bytes]], limit: int) -> bool:
    """Fill ``cycle`` from the request headers; False when falcon must serve the request: no
    ``Content-Length`` or one over ``limit``, a chunked or compressed body, ``Expect``, or a
    header this path reads given twice."""
    length = None
    for name, value in headers:  # uvicorn lower-cases the names
        if name not in _HEADERS_READ:  # most of them (host, accept, content-type...): one set lookup
            continue
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return False
            length = int(value)
        elif name == b"inference-header-content-length":
            if cycle.header_length is not None:
                return False
            cycle.header_length = value.decode("latin-1")
        elif name == b"accept-encoding":
            if cycle.accept_encoding is not None:
                return False
            cycle.accept_encoding = value.decode("latin-1")
        elif name == b"traceparent":
            if cycle.traceparent:
                return False
            cycle.traceparent = value.decode("latin-1")
        elif name == TIMEOUT_HEADER_BYTES:
            if cycle.timeout is not None:
                return False
            cycle.timeout = value.decode("latin-1")
        elif name in (b"transfer-encoding", b"content-encoding", b"expect"):
            return False
    return length is not None and length <= limit


class FastInferProtocol(HttpToolsProtocol):
    """The HTTP ingress's protocol with plain infer requests served without ASGI (see the module)."""

    infer: Infer  # set on the class that ``fast_protocol_class`` makes
    max_body_bytes: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fast: FastCycle | None = None
        # The last infer URL served on this connection and its target (model, version, path): a
        # client sends the same one again and again.
        self._last_url = b""
        self._last_target: tuple[str, str, bytes] = ("", "", b"")

    def on_message_begin(self) -> None:
        # uvicorn's, less the ASGI scope: a request served here needs none (``_make_scope`` makes it
        # for one that goes to falcon).
        self.begin_message()
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def _make_scope(self) -> None:
        """The ASGI scope uvicorn's ``on_message_begin`` would have made, over the head read."""
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        UvicornHttpToolsProtocol.on_message_begin(self)
        self.url, self.expect_100_continue = url, expect
        self.headers = self.scope["headers"] = headers

    def on_headers_complete(self) -> None:
        cycle = self._take()
        if cycle is None:
            self._make_scope()
            super().on_headers_complete()
            return
        self.head_complete()
        self._fast = self.cycle = cycle  # type: ignore[assignment]

    def _take(self) -> FastCycle | None:
        """A ``FastCycle`` for a plain infer request that may run now; None for the rest."""
        parser = self.parser
        if parser.get_method() != b"POST" or (self.cycle is not None and not self.cycle.response_complete):
            return None
        if self.limit_concurrency is not None or parser.should_upgrade():
            return None
        url = self.url
        if url == self._last_url:
            model, version, path = self._last_target
        else:
            match = INFER_PATH.fullmatch(url.partition(b"?")[0])
            if match is None or not match[0].isascii():
                return None
            model, version, path = self._last_target = (match[1].decode(), (match[2] or b"").decode(), match[0])
            self._last_url = url
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        cycle = FastCycle(model, version, path, keep_alive)
        return cycle if _read_headers(cycle, self.headers, self.max_body_bytes) else None

    def on_body(self, body: bytes) -> None:
        fast = self._fast
        if fast is None:
            super().on_body(body)
        else:
            fast.chunks.append(body)

    def on_message_complete(self) -> None:
        fast = self._fast
        if fast is None:
            super().on_message_complete()
            return
        self._fast = None
        self.expect_head()
        infer = self.infer
        try:
            request = self._parse(fast)
            if request is None or fast.timeout is not None or infer.forward is not None:
                sent = None
            else:
                call = request.call
                call.traceparent = fast.traceparent
                sent = infer.dataplane.start(call)
        except _LookUpFirst as refused:
            task = self.loop.create_task(self._fail_model_first(fast, refused.refusal))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)
            self.running = (fast, task)
            return
        except Exception as exc:
            self._fail(fast, exc)
            return
        if sent is None:  # something may wait: a task runs the steps that are left
            task = self.loop.create_task(self._serve(fast, request))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)
            self.running = (fast, task)  # cancelled if the client goes away (``connection_lost``)
            return
        # Nothing waits but the router's answer: no task, the answer's callback responds (``_Awaiting``).
        assert request is not None
        awaiting = _Awaiting(self, fast, request, sent.id)
        self.tasks.add(awaiting)  # type: ignore[arg-type]
        self.running = (fast, awaiting)
        infer.dataplane.link.submit(sent, awaiting.answered)

    def _parse(self, cycle: FastCycle) -> HttpInferRequest | None:
        """The request, when its body has a JSON header (None: a raw body, which ``Infer.parse`` reads)."""
        infer = self.infer
        try:
            header_length = parse_header_length(cycle.header_length)
        except ConveyorError as exc:  # counted as the model's REJECTED failure, as falcon's path does
            infer.dataplane.refused(cycle.model, cycle.version, exc)
            raise
        if header_length == 0:
            return None
        try:
            request = infer.parse_json(cycle.body(), cycle.model, cycle.version, header_length)
        except ConveyorError as exc:
            if infer.dataplane.models.cached(cycle.model, cycle.version) is None:
                raise _LookUpFirst(exc) from None  # the model may not be there: its error is the answer
            raise
        cycle.chunks = []  # a JSON-only body is garbage now; binary inputs keep their views of it alive
        return request

    async def _serve(self, cycle: FastCycle, request: HttpInferRequest | None) -> None:
        """The request's steps from ``request`` (None: from its raw body) on, in a task."""
        infer = self.infer
        try:
            if request is None:
                request = await infer.parse(cycle.body(), cycle.model, cycle.version, 0)
                cycle.chunks = []
            answer = await infer.answer(request, cycle.traceparent, cycle.accept_encoding, timeout=cycle.timeout)
        except Exception as exc:
            self._fail(cycle, exc)
            return
        self._succeed(cycle, answer)

    async def _fail_model_first(self, cycle: FastCycle, refusal: ConveyorError) -> None:
        """Answer a refused body of a model not known here with the model's own error, if it has one."""
        self._fail(cycle, await self.infer.model_first(refusal, cycle.model, cycle.version))

    def _fail(self, cycle: FastCycle, exc: Exception) -> None:
        status, message = error_status(exc, "POST", cycle.path.decode("latin-1"))
        body = error_body(message)
        length = b"content-length: %d\r\n" % len(body)
        head = (_JSON_TYPE + RETRY_AFTER_LINE + length) if status == 503 else (_JSON_TYPE + length)
        self._respond(cycle, status, head, body)

    def _succeed(self, cycle: FastCycle, answer: InferAnswer) -> None:
        content_type = _CONTENT_TYPES.get(answer.content_type)
        if content_type is None:
            content_type = _CONTENT_TYPES[answer.content_type] = b"content-type: %s\r\n" % answer.content_type.encode()
        head = [content_type]
        for name, value in answer.headers:
            line = _HEADER_NAMES.get(name)
            if line is None:
                line = _HEADER_NAMES[name] = name.lower().encode("latin-1") + b": "
            head += [line, value.encode("latin-1"), b"\r\n"]
        data = answer.data
        head.append(b"content-length: %d\r\n" % len(data))
        lines = b"".join(head)
        if answer.layout is not None:  # the next answer of the template like this one goes with the same lines
            answer.layout.head = lines
        self._respond(cycle, 200, lines, data)

    async def _compress_and_send(self, cycle: FastCycle, answer: InferAnswer) -> None:
        try:
            answer = await self.infer.compressed(answer)
        except Exception as exc:
            self._fail(cycle, exc)
            return
        self._succeed(cycle, answer)

    def _respond(self, cycle: FastCycle, status: int, lines: bytes, data: bytes) -> None:
        """Write the response (``lines``: its own head lines, Content-Length included) as one write,
        then let the connection go on (or close it)."""
        cycle.response_complete = cycle.response_started = True
        if cycle.disconnected:
            return
        global _defaults, _default_lines
        defaults = self.server_state.default_headers
        if defaults is not _defaults:  # uvicorn makes a new list when the date changes (once a second)
            _default_lines = b"".join([b"%s: %s\r\n" % pair for pair in defaults])
            _defaults = defaults
        end = b"\r\n" if cycle.keep_alive else _CLOSE + b"\r\n"
        transport = cast(CorkedTransport, self.transport)  # as ``HttpToolsProtocol.connection_made`` wraps it
        transport.send_now(b"".join((STATUS_LINE[status], _default_lines, lines, end)), data)
        if not cycle.keep_alive:
            transport.close()
        self.on_response_complete()


class _Awaiting:
    """A request sent without a task (``FastInferProtocol.on_message_complete``), until its answer.

    It stands in the server's task set as the task would: uvicorn's shutdown waits for it, and
    past its grace ``cancel``s it, as the protocol does when the client goes away; that abandons
    the request as cancelling the task did (the router is told; the answer, when it comes, only
    frees its memory)."""

    __slots__ = ("cycle", "done", "protocol", "request", "rid")

    def __init__(self, protocol: FastInferProtocol, cycle: FastCycle, request: HttpInferRequest, rid: int) -> None:
        self.protocol = protocol
        self.cycle = cycle
        self.request = request
        self.rid = rid
        self.done = False

    def answered(self, response: m.InferResponse) -> None:
        self.done = True
        protocol = self.protocol
        protocol.tasks.discard(self)
        infer = protocol.infer
        dataplane = infer.dataplane
        request, cycle = self.request, self.cycle
        try:
            dataplane.answered_unread(response)
            layout = request.layout
            if layout is not None and cycle.accept_encoding is None:
                # Laid out as the template's last answer: its JSON header and head lines again, the new bytes.
                data = layout.body(response, dataplane.regions)
                if data is not None:
                    protocol._respond(cycle, 200, layout.head, data)
                    return
                result = dataplane.result(response, request.call)
                answer = infer.render(result, request, None, response)
            else:
                answer = infer.render(dataplane.result(response, request.call), request, cycle.accept_encoding)
        except Exception as exc:
            protocol._fail(cycle, exc)
            return
        if answer.coding is None:
            protocol._succeed(self.cycle, answer)
            return
        task = protocol.loop.create_task(protocol._compress_and_send(self.cycle, answer))
        task.add_done_callback(protocol.tasks.discard)
        protocol.tasks.add(task)

    def cancel(self, msg: str | None = None) -> bool:
        if self.done:
            return False
        self.done = True
        protocol = self.protocol
        # Out of the set later, as a cancelled task's done callback does: uvicorn cancels while iterating it.
        protocol.loop.call_soon(protocol.tasks.discard, self)
        dataplane = protocol.infer.dataplane
        dataplane.abandoned()
        dataplane.link.abandon(self.rid)
        return True


def fast_protocol_class(infer: Infer, max_body_bytes: int) -> type[FastInferProtocol]:
    """``FastInferProtocol`` serving through ``infer``, refusing (through falcon) bodies over ``max_body_bytes``."""
    return type("BoundFastInferProtocol", (FastInferProtocol,), {"infer": infer, "max_body_bytes": max_body_bytes})
