"""The request bodies of ``/v1/completions`` and ``/v1/chat/completions``, decoded and
type-checked in one pass (msgspec), and the sampling parameters they carry.

Fields the OpenAI API or vLLM's server define but this ingress cannot honour (``suffix``, ``best_of``,
``use_beam_search``, ``truncate_prompt_tokens``, ``prompt_logprobs``) are refused with a 400 rather than
ignored;
unknown fields are accepted and ignored, as OpenAI's own server and vLLM's do, and each
unknown top-level name is logged once per process (vLLM warns on every request), so a
client's misspelt ``max_token`` shows in the log without flooding it. vLLM's extensions to the
API (``top_k``, ``min_p``, ``repetition_penalty``, ``ignore_eos``, ``min_tokens``, ``stop_token_ids``, ``bad_words``,
``allowed_token_ids``, ``include_stop_str_in_output``, ``skip_special_tokens``,
``spaces_between_special_tokens``, ``priority``, and OpenAI's ``logit_bias``,
``structured_outputs``, ``stream_options.continuous_usage_stats``: the usage so far on every
chunk) pass through, as vLLM's server takes them. Structured outputs: ``response_format``
(``json_object``, ``json_schema``) or vLLM's ``structured_outputs`` (``json``, ``regex``,
``choice``, ``grammar``) become the engine's guided decoding; a schema or pattern the engine
cannot compile is a 400 with its reason (from the worker). Tool definitions, ``tool_choice`` and the
tool-call parts of the history are decoded here and checked in ``tools.py``. Every count and size a client
chooses (``n``, stop strings, logprobs, messages, schemas, ...) is bounded by ``proto/llm_limits.py``,
checked before anything is allocated per item.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar, cast

import msgspec
import orjson

from conveyor.proto import llm_limits
from conveyor.proto.errors import ConveyorError, Status, invalid_arg

log = logging.getLogger(__name__)


class StreamOptions(msgspec.Struct):
    include_usage: bool = False
    # vLLM's extension: with include_usage, every chunk carries the usage so far (aiperf's
    # --per-chunk-usage reads it to count the tokens of a stream's first chunk).
    continuous_usage_stats: bool = False


class JsonSchema(msgspec.Struct):
    name: str | None = None
    schema: dict[str, Any] | bool | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(msgspec.Struct):
    type: str = "text"  # OpenAI's default; Triton's model leaves it out too
    json_schema: JsonSchema | None = None


class Sampling(msgspec.Struct, kw_only=True):
    """What both endpoints share."""

    model: str
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # vLLM's extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    structured_outputs: dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    logprobs: Any = None  # completions: a number of alternatives; chat: true or false
    request_id: str | None = None  # vLLM's: the request's id when no X-Request-Id header gives one
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # OpenAI's: the request's session, kept on one engine as the ``x-session-id`` header (which wins)
    prompt_cache_key: str | None = None
    # vLLM's extensions, passed to the engine's SamplingParams
    stop_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    priority: int = 0  # the engine's scheduling priority (lower first, with vLLM's "priority" policy)
    # vLLM's extensions refused when set (``check_unsupported``)
    use_beam_search: bool = False
    truncate_prompt_tokens: int | None = None
    prompt_logprobs: int | None = None


class CompletionRequest(Sampling, kw_only=True):
    prompt: str | list[Any]  # text, texts, token ids, or lists of them: ``prompts.read_prompts``
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class ImageUrl(msgspec.Struct):
    url: str
    detail: str | None = None  # OpenAI's "auto" / "low" / "high": the engine's processor decides the size


class InputAudio(msgspec.Struct):
    data: str
    format: str


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None
    image_url: ImageUrl | None = None
    input_audio: InputAudio | None = None


class CalledFunction(msgspec.Struct):
    name: str
    # OpenAI's is a JSON text; some clients send the object itself (vLLM takes both)
    arguments: str | dict[str, Any] | None = None


class MessageToolCall(msgspec.Struct):
    """A call an earlier assistant turn made, as the client sends it back in the history."""

    function: CalledFunction
    id: str | None = None
    type: str = "function"


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant's turn that called tools
    tool_call_id: str | None = None  # a ``tool`` message: the call it answers


class FunctionDefinition(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None


class ToolDefinition(msgspec.Struct):
    function: FunctionDefinition
    type: str = "function"


class ToolChoiceFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct):
    """``{"type": "function", "function": {"name": ...}}``: the answer is a call of that function."""

    function: ToolChoiceFunction
    type: str = "function"


class ChatRequest(Sampling, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    top_logprobs: int | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: str | NamedToolChoice | None = None  # "none", "auto", "required" or a named function
    parallel_tool_calls: bool | None = None


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """vLLM's ``/tokenize``: a ``prompt``, or chat ``messages`` written with the model's template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # vLLM's defaults: true for a prompt, false for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    tools: list[ToolDefinition] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[int]


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """``/v1/embeddings`` (``embeddings.py``)."""

    model: str
    input: str | list[Any]
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None  # OpenAI's; accepted and ignored, as vLLM does
    # vLLM's extensions
    request_id: str | None = None
    use_activation: bool | None = None
    embed_dtype: str = "float32"
    endianness: str = "native"


class SchemaError(ConveyorError):
    """INVALID_ARG: a body its request type refuses (not JSON, a field missing or of the wrong type or value). It
    keeps the body and the type, for the answer that is the schema's own account of the body
    (``--openai-error-form triton``: FastAPI's 422, ``triton_schema.detail``)."""

    def __init__(self, message: str, kind: type, body: bytes) -> None:
        super().__init__(Status.INVALID_ARG, message)
        self.kind = kind
        self.body = body


_PASSED = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "top_k", "min_p",
           "repetition_penalty", "ignore_eos", "min_tokens", "logit_bias", "stop_token_ids", "bad_words",
           "allowed_token_ids", "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens")


T = TypeVar("T")


_UNKNOWN = "Object contains unknown field"
_STRICT: dict[type, type] = {}  # a request type -> the same refusing unknown top-level fields
_LOGGED: set[tuple[str, str]] = set()  # (request type, field) already logged
_LOGGED_MAX = 256  # a client sending random names cannot grow it without bound


def decode(body: bytes, kind: type[T]) -> T:
    """The body as ``kind``. Decoded first as a type that refuses unknown top-level fields, which costs
    the same: only a body that has some is decoded again without them, and its names are logged."""
    strict = _STRICT.get(kind)
    if strict is None:
        strict = _STRICT[kind] = type(kind.__name__, (kind,), {}, forbid_unknown_fields=True)
    llm_limits.check_body_values(body)  # before any value is decoded
    try:
        return cast(T, decode_as(body, strict, kind))
    except SchemaError as exc:
        if not exc.message.startswith(_INVALID + _UNKNOWN):
            raise
    out = cast(T, decode_as(body, kind, kind))
    _log_unknown(body, kind)
    return out


_INVALID = "invalid request: "


def decode_as(body: bytes, decoded: type, kind: type) -> Any:
    """The body as ``decoded`` (``kind`` or a type made of it); a refusal is a ``SchemaError`` of ``kind``. The
    caller has checked the body's count of values (``llm_limits.check_body_values``)."""
    try:
        return msgspec.json.decode(body, type=decoded)
    except msgspec.ValidationError as exc:
        raise SchemaError(f"{_INVALID}{exc}", kind, body) from None
    except msgspec.DecodeError as exc:
        raise SchemaError(f"the request body is not valid JSON: {exc}", kind, body) from None
    except RecursionError:  # msgspec's decoder recurses into nested arrays and objects
        raise SchemaError("the request body is nested too deeply to decode", kind, body) from None


def _log_unknown(body: bytes, kind: type) -> None:
    known = set(getattr(kind, "__struct_fields__", ()))
    for name in sorted(set(msgspec.json.decode(body, type=dict[str, msgspec.Raw])) - known):
        key = (kind.__name__, name)
        if key not in _LOGGED and len(_LOGGED) < _LOGGED_MAX:
            _LOGGED.add(key)
            log.warning("%s: ignoring the unknown field '%s' (logged once)", kind.__name__, name)


def sampling_parameters(req: Sampling, max_tokens: int) -> dict[str, Any]:
    """The ``sampling_parameters`` JSON of Triton's vLLM model contract (vLLM's ``SamplingParams``), within
    ``proto/llm_limits.py``'s bounds: checked before the caller allocates anything per choice."""
    llm_limits.check_n(req.n)
    check_unsupported(req)
    if req.stream_options is not None and not req.stream:
        raise invalid_arg("`stream_options` can only be used when `stream` is True")
    if max_tokens < 1:
        raise invalid_arg("max_tokens must be at least 1")
    params: dict[str, Any] = {"n": req.n, "max_tokens": max_tokens}
    for name in _PASSED:
        value = getattr(req, name)
        if value is not None:
            params[name] = value
    if req.stop:
        params["stop"] = [req.stop] if isinstance(req.stop, str) else req.stop
    constraint = structured_outputs(req)
    if constraint is not None:
        params["structured_outputs"] = constraint
    top = logprobs_asked(req)
    if top is not None:
        params["logprobs"] = top
        if isinstance(req, CompletionRequest) and req.echo:  # the echoed prompt's tokens, as vLLM
            params["prompt_logprobs"] = top
    if req.priority:
        params["priority"] = req.priority
    llm_limits.check_sampling(params, max_logprobs=llm_limits.MAX_LOGPROBS,
                              max_stop_strings=llm_limits.MAX_STOP_STRINGS)
    return params


def check_unsupported(req: Sampling) -> None:
    """vLLM's fields this ingress cannot honour: a 400 rather than an answer that ignored them."""
    if req.use_beam_search:
        raise invalid_arg("use_beam_search is not supported")
    if req.truncate_prompt_tokens is not None:
        raise invalid_arg("truncate_prompt_tokens is not supported")
    if req.prompt_logprobs is not None:
        echo = " (`echo` with `logprobs` shows the prompt's tokens' logprobs)" if isinstance(req, CompletionRequest) \
            else ""
        raise invalid_arg(f"prompt_logprobs is not supported{echo}")


def logprobs_asked(req: Sampling) -> int | None:
    """How many alternatives per token the answer carries besides the chosen token (vLLM's
    ``logprobs``); None: no logprobs. Chat asks with ``logprobs: true`` and ``top_logprobs``,
    completions with ``logprobs: N``."""
    if isinstance(req, ChatRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise invalid_arg("`top_logprobs` can only be used when `logprobs` is True")  # Triton's words
        if req.logprobs in (None, False):
            return None
        if not isinstance(req.logprobs, bool):
            raise invalid_arg("`logprobs` of a chat request is true or false")
        top = req.top_logprobs or 0
        name = "top_logprobs"
    else:
        if req.logprobs is None:
            return None
        if isinstance(req.logprobs, bool) or not isinstance(req.logprobs, int):
            raise invalid_arg("`logprobs` of a completion request is a number of alternatives (0 to "
                              f"{llm_limits.MAX_LOGPROBS})")
        top = req.logprobs
        name = "logprobs"
    llm_limits.check_logprobs(name, top, llm_limits.MAX_LOGPROBS)
    return top


def structured_outputs(req: Sampling) -> dict[str, Any] | None:
    """The guided-decoding constraint (vLLM's ``StructuredOutputsParams`` fields) the request asks for."""
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return req.structured_outputs
    if req.structured_outputs is not None:
        raise invalid_arg("`response_format` and `structured_outputs` cannot both be set")
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema is None:
            raise invalid_arg("`response_format` of type 'json_schema' needs `json_schema.schema`")
        return {"json": fmt.json_schema.schema}
    raise invalid_arg(f"unknown `response_format` type '{fmt.type}': expected 'text', 'json_object' or 'json_schema'")


def check_completion(req: CompletionRequest) -> None:
    """What a completion request asks that no engine here does, in Triton's frontend's words."""
    if req.suffix:
        raise invalid_arg("suffix is not currently supported")
    if req.best_of not in (None, 1):
        raise invalid_arg("best_of is no longer supported in vLLM backend, removed from vLLM V1 engine")


def chat_messages(req: ChatRequest | TokenizeRequest, images: list[str] | None = None) -> list[dict[str, Any]]:
    """The conversation as a chat template reads it: text parts joined by newlines, as vLLM does; an
    assistant turn's ``tool_calls`` with their arguments as objects, as transformers' tool-use templates
    expect them (vLLM parses them so too), and a tool message's ``tool_call_id``. ``images``: where the
    ``image_url`` parts' URLs go, in order (None: a route that takes none refuses them); their place in the
    text is the engine's (it puts an image's tokens where its model wants them)."""
    if not req.messages:
        raise invalid_arg("messages must be non-empty")
    llm_limits.check_messages(len(req.messages))  # first: the count alone, before any message is read
    llm_limits.check_message_parts(sum((len(m.content) if isinstance(m.content, list) else 0)
                                       + len(m.tool_calls or ()) for m in req.messages))
    out = []
    for i, msg in enumerate(req.messages):
        content = msg.content
        if isinstance(content, list):
            content = "\n".join(_texts(content, images))
        entry: dict[str, Any] = {"role": msg.role, "content": content or ""}
        if msg.name:
            entry["name"] = msg.name
        if msg.tool_calls:
            if msg.role != "assistant":
                raise invalid_arg(f"messages[{i}]: only an assistant message carries `tool_calls`")
            entry["tool_calls"] = [_history_call(i, call) for call in msg.tool_calls]
        if msg.role == "tool":
            if not msg.tool_call_id:
                raise invalid_arg(f"messages[{i}]: a message of role 'tool' needs `tool_call_id`")
            entry["tool_call_id"] = msg.tool_call_id
        out.append(entry)
    return out


def _texts(parts: list[ContentPart], images: list[str] | None) -> list[str]:
    """The text parts' texts; an ``image_url`` part's URL goes to ``images`` (None: refused)."""
    texts = []
    for part in parts:
        if part.type == "text":
            texts.append(part.text or "")
        elif part.type == "image_url" and images is not None:
            if part.image_url is None:
                raise invalid_arg("a content part of type 'image_url' needs `image_url`")
            images.append(part.image_url.url)
        elif images is None:
            raise invalid_arg("only text content parts are supported")
        else:  # input_audio: no Triton vLLM contract carries audio
            raise invalid_arg(f"content parts of type '{part.type}' are not supported")
    return texts


def _history_call(i: int, call: MessageToolCall) -> dict[str, Any]:
    if call.type != "function":
        raise invalid_arg(f"messages[{i}]: only tool calls of type 'function' are supported, got '{call.type}'")
    arguments: Any = call.function.arguments or {}
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            # As vLLM: a malformed call lives on in the history, and refusing it would refuse every later
            # turn of the conversation; the template sees an empty object instead.
            arguments = {}
        if not isinstance(arguments, dict):
            arguments = {}
    # The template writes them (``tojson``, which recurses): as deep as a schema may be.
    llm_limits.check_depth(arguments, f"messages[{i}]: a tool call's arguments")
    doc: dict[str, Any] = {"type": "function", "function": {"name": call.function.name, "arguments": arguments}}
    if call.id is not None:
        doc["id"] = call.id
    return doc
