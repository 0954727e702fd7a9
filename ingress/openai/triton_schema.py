"""Triton's OpenAI frontend's request schema (its ``schemas/openai.py``: pydantic models, unknown fields
forbidden), for ``--openai-error-form triton``.

Two halves of one schema. On the request path, each request type is decoded as Conveyor's own
(``schema.py``) with Triton's bounds and types on the fields Triton's models declare (``temperature`` 0 to 2,
a completion's ``logprobs`` 0 to 5, ``messages`` not empty, ...) and unknown fields refused: the same one
msgspec pass, no work more per request. When msgspec refuses a body, ``detail`` validates it again with the
models below, written in ``fastapi_errors.py``'s nodes as Triton's are in pydantic, and says what FastAPI's
422 says: each error as pydantic words it. Fields Conveyor takes beyond Triton's models (vLLM's ``top_k``,
``structured_outputs``, ...) are taken here too, with their own types (``struct_node``), and values Triton's
models refuse but Conveyor's types take (a list of prompts, a ``json_schema`` response format) are served as
Conveyor serves them. What Triton's engine refuses of a request its models take (``n`` > 1, ``logit_bias``,
``best_of``) is refused in its words (``engine_refusals``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Annotated, Any, Literal, TypeVar, cast, get_args

import msgspec

from conveyor.ingress.openai import fastapi_errors as fe
from conveyor.ingress.openai.fastapi_errors import (
    Bool,
    Choice,
    Dict,
    Float,
    Int,
    List,
    MinLength,
    Model,
    Named,
    Node,
    Optional,
    Str,
    Union,
    Url,
)
from conveyor.ingress.openai.forms import TRITON
from conveyor.ingress.openai.schema import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    Sampling,
    SchemaError,
    decode,
    decode_as,
)
from conveyor.proto import llm_limits
from conveyor.proto.errors import ConveyorError, invalid_arg
from conveyor.proto.llm_limits import INT64_MAX, INT64_MIN

T = TypeVar("T")


def _opt(node: Node) -> Node:
    return Optional(node)


def _enum(name: str, *values: str) -> Choice:
    return Choice(values, enum=name)


# Triton's models, field by field in its order (schemas/openai.py at e1db8a6).
_MODEL1 = _enum("Model1", "gpt-3.5-turbo-instruct", "davinci-002", "babbage-002")
_MODEL2 = _enum("Model2", "gpt-4-turbo", "gpt-4-turbo-2024-04-09", "gpt-4-0125-preview", "gpt-4-turbo-preview",
                "gpt-4-1106-preview", "gpt-4-vision-preview", "gpt-4", "gpt-4-0314", "gpt-4-0613", "gpt-4-32k",
                "gpt-4-32k-0314", "gpt-4-32k-0613", "gpt-3.5-turbo", "gpt-3.5-turbo-16k", "gpt-3.5-turbo-0301",
                "gpt-3.5-turbo-0613", "gpt-3.5-turbo-1106", "gpt-3.5-turbo-0125", "gpt-3.5-turbo-16k-0613")
_PENALTY = _opt(Float(ge=-2.0, le=2.0))
_COUNT = _opt(Int(ge=0))
_SEED = _opt(Int(ge=INT64_MIN, le=INT64_MAX))
_STOP = _opt(Union((Str(), List(Str()))))
_STREAM_OPTIONS = _opt(Model("StreamOptions", (("include_usage", _opt(Bool()), False),)))
_PARAMETERS = Model("FunctionParameters", (), extra="allow")

COMPLETION = Model("CreateCompletionRequest", (
    ("model", Union((Str(), _MODEL1)), True),
    ("prompt", Union((Str(), List(Str()), List(Int()), List(Named("PromptItem", List())))), True),
    ("best_of", _opt(Int(ge=0, le=20)), False),
    ("echo", _opt(Bool()), False),
    ("frequency_penalty", _PENALTY, False),
    ("ignore_eos", _opt(Bool()), False),
    ("logit_bias", _opt(Dict(Int())), False),
    ("logprobs", _opt(Int(ge=0, le=5)), False),
    ("max_tokens", _COUNT, False),
    ("min_tokens", _COUNT, False),
    ("n", _opt(Int(ge=1, le=128)), False),
    ("presence_penalty", _PENALTY, False),
    ("seed", _SEED, False),
    ("stop", _STOP, False),
    ("stream", _opt(Bool()), False),
    ("stream_options", _STREAM_OPTIONS, False),
    ("suffix", _opt(Str()), False),
    ("temperature", _opt(Float(ge=0.0, le=2.0)), False),
    ("top_p", _opt(Float(ge=0.0, le=1.0)), False),
    ("user", _opt(Str()), False),
), extra="forbid")


def _message(name: str, role: str, *fields: tuple[str, Node, bool]) -> Model:
    return Model(name, tuple((n, _enum(f"Role{role}", role) if n == "role" else node, req) for n, node, req in fields))


_ROLE = Str()  # stands for the role's enum: ``_message`` puts each message's in its place
_PART = Named("ChatCompletionRequestMessageContentPart", Union((
    Model("ChatCompletionRequestMessageContentPartText", (("type", _enum("Type1", "text"), True),
                                                         ("text", Str(), True))),
    Model("ChatCompletionRequestMessageContentPartImage", (
        ("type", _enum("Type", "image_url"), True),
        ("image_url", Model("ImageUrl", (("url", Url(), True),
                                         ("detail", _opt(_enum("Detail", "auto", "low", "high")), False))), True))),
)))
_TOOL_CALLS = _opt(Named("ChatCompletionMessageToolCalls", List(Model("ChatCompletionMessageToolCall", (
    ("id", Str(), True), ("type", Str(), True),
    ("function", Model("Function1", (("name", Str(), True), ("arguments", Str(), True))), True))))))
_MESSAGE = Named("ChatCompletionRequestMessage", Union((
    _message("ChatCompletionRequestSystemMessage", "system", ("content", Str(), True), ("role", _ROLE, True),
             ("name", _opt(Str()), False)),
    _message("ChatCompletionRequestUserMessage", "user", ("content", Union((Str(), List(_PART))), True),
             ("role", _ROLE, True), ("name", _opt(Str()), False)),
    _message("ChatCompletionRequestAssistantMessage", "assistant", ("content", _opt(Str()), False),
             ("role", _ROLE, True), ("name", _opt(Str()), False), ("tool_calls", _TOOL_CALLS, False),
             ("function_call", _opt(Model("FunctionCall", (("arguments", Str(), True), ("name", Str(), True)))),
              False)),
    _message("ChatCompletionRequestToolMessage", "tool", ("role", _ROLE, True), ("content", Str(), True),
             ("tool_call_id", Str(), True)),
    _message("ChatCompletionRequestFunctionMessage", "function", ("role", _ROLE, True), ("content", Str(), True),
             ("name", Str(), True)),
)))
_FUNCTION = (("description", _opt(Str()), False), ("name", Str(), True), ("parameters", _opt(_PARAMETERS), False))

CHAT = Model("CreateChatCompletionRequest", (
    ("messages", List(_MESSAGE, min_length=1), True),
    ("model", Union((Str(), _MODEL2)), True),
    ("frequency_penalty", _PENALTY, False),
    ("ignore_eos", _opt(Bool()), False),
    ("logit_bias", _opt(Dict(Int())), False),
    ("logprobs", _opt(Bool()), False),
    ("top_logprobs", _opt(Int(ge=0, le=20)), False),
    ("max_completion_tokens", _COUNT, False),
    ("max_tokens", _COUNT, False),
    ("min_tokens", _COUNT, False),
    ("n", _opt(Int(ge=1, le=128)), False),
    ("presence_penalty", _PENALTY, False),
    ("response_format", _opt(Model("ResponseFormat", (
        ("type", _opt(_enum("Type6", "text", "json_object")), False),))), False),
    ("seed", _SEED, False),
    ("stop", _STOP, False),
    ("stream", _opt(Bool()), False),
    ("stream_options", _STREAM_OPTIONS, False),
    ("temperature", _opt(Float(ge=0.0, le=2.0)), False),
    ("top_p", _opt(Float(ge=0.0, le=1.0)), False),
    ("tools", _opt(List(Model("ChatCompletionTool", (
        ("type", Str(), True), ("function", Model("FunctionObject", _FUNCTION), True))))), False),
    ("tool_choice", _opt(Named("ChatCompletionToolChoiceOption", Union((
        _enum("ChatCompletionToolChoiceOption1", "none", "auto", "required"),
        Model("ChatCompletionNamedToolChoice", (
            ("type", Str(), True), ("function", Model("Function", (("name", Str(), True),)), True))))))), False),
    ("user", _opt(Str()), False),
    ("function_call", _opt(Union((_enum("FunctionCall3", "none", "auto"),
                                  Model("ChatCompletionFunctionCallOption", (("name", Str(), True),))))), False),
    ("functions", _opt(List(Model("ChatCompletionFunctions", _FUNCTION), min_length=1, max_length=128)), False),
), extra="forbid")

EMBEDDING = Model("CreateEmbeddingRequest", (
    ("input", MinLength(Union((Str(), List(Int()))), 1), True),
    ("model", Union((Str(), _MODEL2)), True),
    ("dimensions", _opt(Int()), False),
    ("encoding_format", _opt(Choice(("float", "base64"))), False),
    ("user", _opt(Str()), False),
), extra="forbid")

_MODELS: dict[type, Model] = {CompletionRequest: COMPLETION, ChatRequest: CHAT, EmbeddingRequest: EMBEDDING}


@cache
def schema_of(kind: type) -> Node:
    """What ``detail`` validates a body of ``kind`` with: Triton's model, then the fields of Conveyor's own
    type that Triton's has not; a kind Triton has no model for (vLLM's routes), Conveyor's type alone."""
    own = fe.struct_node(kind)
    model = _MODELS.get(kind)
    return own if model is None else model.with_fields(own.fields)


def detail(kind: type, body: bytes, message: str) -> list[dict[str, Any]] | None:
    """FastAPI's 422 ``detail`` for a body of ``kind`` that decoding refused with ``message``; None when FastAPI
    could not read the body at all."""
    errors = fe.body_errors(schema_of(kind), body)
    if errors == []:  # refused here, taken by Triton's model: msgspec's own words, where it found the error
        return fe.fallback(message)
    return errors


# The request path: Conveyor's types with Triton's bounds and types on Triton's fields.


def _bounded(annotation: Any, node: Node) -> Any:
    """``annotation`` (``int``, ``float``, or either or null) within ``node``'s bounds."""
    inner = node.inner if isinstance(node, Optional) else node
    assert isinstance(inner, (Int, Float))
    args = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
    bounded = cast(Any, Annotated)[args[0], msgspec.Meta(ge=inner.ge, le=inner.le)]
    return (bounded | None) if type(None) in get_args(annotation) else bounded


def _fields(kind: type[msgspec.Struct], model: Model, special: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``kind``'s fields Triton bounds (``Int``/``Float`` with ``ge``/``le``), their types bounded as Triton's, and
    ``special``'s; each with ``kind``'s default."""
    out: list[tuple[str, Any, Any]] = []
    for f in msgspec.structs.fields(kind):
        node = next((n for name, n, _ in model.fields if name == f.name), None)
        inner = node.inner if isinstance(node, Optional) else node
        if f.name in special:
            annotation = special[f.name]
        elif isinstance(inner, (Int, Float)) and (inner.ge is not None or inner.le is not None):
            annotation = _bounded(f.type, cast(Node, node))
        else:
            continue
        if f.default_factory is not msgspec.NODEFAULT:
            out.append((f.name, annotation, msgspec.field(default_factory=f.default_factory)))
        else:
            out.append((f.name, annotation, f.default))  # NODEFAULT: required, as in ``kind``
    return out


def _triton_type(kind: type[msgspec.Struct], special: dict[str, Any] | None = None,
                 extra: tuple[tuple[str, Any, Any], ...] = (),
                 post_init: Callable[[Any], None] | None = None) -> type[msgspec.Struct]:
    fields = _fields(kind, _MODELS[kind], special or {}) + list(extra)
    namespace = {"__post_init__": post_init} if post_init is not None else None
    return msgspec.defstruct(f"Triton{kind.__name__}", fields, bases=(kind,), kw_only=True,
                             forbid_unknown_fields=True, namespace=namespace)


# The fields Triton's chat model declares that Conveyor's request has not: taken and not used, as Triton's
# engine does not use them either (OpenAI's deprecated forms of ``tools`` and ``tool_choice``).
_DEPRECATED = (("function_call", Literal["none", "auto"] | dict[str, Any] | None, None),
               ("functions", Annotated[list[dict[str, Any]], msgspec.Meta(min_length=1, max_length=128)] | None, None))


def _input_not_empty(request: Any) -> None:
    if not request.input:  # Triton's min_length on ``input`` (a string or a list)
        raise ValueError("Value should have at least 1 item after validation, not 0")


_TYPES: dict[type, type[msgspec.Struct]] = {
    CompletionRequest: _triton_type(CompletionRequest, {"logprobs": Annotated[int, msgspec.Meta(ge=0, le=5)] | None}),
    ChatRequest: _triton_type(ChatRequest, {
        "logprobs": bool | None,
        "messages": Annotated[list[ChatMessage], msgspec.Meta(min_length=1)],
    }, extra=_DEPRECATED),
    EmbeddingRequest: _triton_type(EmbeddingRequest, {"encoding_format": Literal["float", "base64"]},
                                   post_init=_input_not_empty),
}


def decode_triton(body: bytes, kind: type[T]) -> T:
    """The body as ``kind`` within Triton's schema (``--openai-error-form triton``). A refusal is a
    ``SchemaError``, which that form answers with Triton's 422. A body msgspec refuses that pydantic's lax mode
    would take (``"temperature": "0.5"``, ``"stream": 1``) is decoded again with msgspec's lax rules, as
    Triton's frontend takes it."""
    triton = _TYPES.get(kind)
    if triton is None:  # no model of Triton's: Conveyor's own rules (vLLM's routes)
        return decode(body, kind)
    llm_limits.check_body_values(body)  # before any value is decoded
    try:
        return cast(T, decode_as(body, triton, kind))
    except SchemaError as exc:
        if fe.body_errors(schema_of(cast(type, kind)), body) != []:
            raise
        try:
            return cast(T, msgspec.json.decode(body, type=triton, strict=False))
        except (msgspec.ValidationError, msgspec.DecodeError):
            raise exc from None


def engine_refusals(request: Sampling) -> None:
    """What Triton's frontend refuses of a request its model takes, which Conveyor serves as vLLM's server does
    (its ``_validate_completion_request`` / ``_validate_chat_request``), in its words: any ``best_of`` (its vLLM
    backend), ``n`` above 1, ``logit_bias``."""
    completion = isinstance(request, CompletionRequest)
    if isinstance(request, CompletionRequest) and request.best_of is not None:
        raise invalid_arg("best_of is no longer supported in vLLM backend, removed from vLLM V1 engine")
    if request.n > 1:
        raise invalid_arg(f"Received n={request.n}, but only single choice (n=1) is currently supported")
    if request.logit_bias is not None:
        raise invalid_arg("logit bias is not supported" if completion else "logit bias is not currently supported")


def schema_first(error: ConveyorError, kind: type, body: bytes) -> ConveyorError:
    """What Triton's frontend answers for a request Conveyor refused before running it (``error``): its
    model validates the whole body before its route looks at anything, so a body its model refuses is its
    422 whatever else is wrong with it. Only on the error path (a refused request): a body Conveyor's own
    checks refused later (a list mixing prompts and token ids, a ``tool_choice`` no parser has, a tool
    message without ``tool_call_id``) is so told apart from one Triton takes and Conveyor does not (a prompt
    over the limits, an unknown model: the refusal as it is)."""
    if isinstance(error, SchemaError) or kind not in _MODELS or not fe.body_errors(schema_of(kind), body):
        return error
    return SchemaError(error.message, kind, body)


def decoder(form: str) -> Callable[[bytes, type[T]], T]:
    """How the OpenAI port decodes a request body in ``form`` (``--openai-error-form``)."""
    return decode_triton if form == TRITON else decode
