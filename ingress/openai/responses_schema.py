"""The request body of OpenAI's ``POST /v1/responses``, decoded (msgspec, as every body of this ingress) and
made into the chat request it means (``schema.ChatRequest``), which then takes the chat path whole: the
model's chat template, tools and their parser, structured outputs, adapters, placement and migration
(``endpoints.py``), as ``messages_schema.py`` does for Anthropic's API (what both share:
``translated_request.py``).

What each field becomes, as vLLM's Responses server (``vllm/entrypoints/openai/responses``) translates it:

* ``instructions``: the conversation's first (``system``) message; a follow-up's are its own (OpenAI's: the
  previous response's instructions do not carry over).
* ``input``: a string (one ``user`` message) or items: messages (``role`` ``user``, ``assistant``, ``system``,
  or ``developer``, a ``system`` message; ``content`` a string or ``input_text`` / ``output_text`` parts),
  ``function_call`` items (a call an assistant turn made: its ``tool_calls``, one turn for calls in a row)
  and ``function_call_output`` items (a ``tool`` message answering ``call_id``); ``reasoning`` items are
  accepted and left out (the template has no place for them). Other items (images, files, item
  references, hosted tools' calls) are a 400.
* ``previous_response_id``: the stored conversation of that response (``response_store.py``), its answer
  included, leads the input; the follow-up keeps its session, so that it runs on the engine that holds the
  conversation's prefix.
* ``max_output_tokens``, ``temperature``, ``top_p``: the sampling parameters (``max_tokens`` for the first).
* ``tools``: ``function`` tools (``name``, ``description``, ``parameters``, ``strict``); hosted tools (web or
  file search, computer use, code interpreter, MCP, ...) are a 400: nothing here runs them. ``tool_choice``
  ``none``, ``auto``, ``required`` or ``{"type": "function", "name"}``; ``parallel_tool_calls``.
* ``text.format``: ``text``, ``json_object``, or ``json_schema`` (``name``, ``schema``, ``strict``): structured
  outputs, as chat's ``response_format``.
* ``store`` (default true), ``metadata`` (OpenAI's bounds: 16 pairs, keys of 64 characters, values of 512),
  ``user``, ``prompt_cache_key`` (the conversation's session, which ``x-session-id`` overrides): kept and
  echoed. ``reasoning``, ``include``, ``service_tier``, ``truncation`` (``disabled`` or ``auto``: the prompt is
  never cut) and ``stream_options`` are accepted and have no effect. ``background``, ``conversation``,
  ``prompt``, ``top_logprobs`` and ``max_tool_calls`` are a 400: nothing here serves them.

Every count a client chooses is bounded before anything is made per item: the input items (the chat route's
message bound, ``llm_limits.MAX_MESSAGES``, over the stored conversation and the input together), their content
parts (``MAX_MESSAGE_PARTS``) and the tools (``MAX_TOOLS``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from conveyor.ingress.openai.schema import (
    CalledFunction,
    ChatMessage,
    ChatRequest,
    FunctionDefinition,
    MessageToolCall,
    NamedToolChoice,
    ResponseFormat,
    ToolDefinition,
)
from conveyor.ingress.openai.translated_request import (
    ToolChoice,
    check_tools,
    joined,
    named_tool,
    sampled,
    schema_format,
)
from conveyor.proto import llm_limits
from conveyor.proto.errors import invalid_arg

# OpenAI's bounds on ``metadata``: a few short labels on a stored object, not a payload.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
_SKIPPED_ITEMS = ("reasoning",)  # the model's own reasoning in the history: no template here has a place for it


class Part(msgspec.Struct):
    """A content part of a message item or of a ``function_call_output``'s output."""

    type: str
    text: str | None = None
    refusal: str | None = None


class Item(msgspec.Struct):
    """One input item: its ``type`` (absent: a message) says which fields it has."""

    type: str | None = None
    role: str | None = None  # message
    content: str | list[Part] | None = None  # message
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None  # function_call
    arguments: str | None = None  # function_call: a JSON text
    output: str | list[Part] | None = None  # function_call_output
    id: str | None = None
    status: str | None = None


class Tool(msgspec.Struct):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(msgspec.Struct):
    type: str = "text"
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class TextConfig(msgspec.Struct):
    format: TextFormat | None = None
    verbosity: str | None = None  # no effect: the engines have no such knob


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[Item]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[Tool] | None = None
    tool_choice: str | ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True  # OpenAI's default
    metadata: dict[str, str] | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    # accepted, no effect (module docstring)
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    service_tier: str | None = None
    truncation: str | None = None
    stream_options: dict[str, Any] | None = None
    # refused when set (module docstring)
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None


def check(req: ResponsesRequest) -> None:
    """What has no meaning here, and the counts, before anything is made per item."""
    if req.background:
        raise invalid_arg("`background` is not supported: a response runs while its request is open")
    for name in ("conversation", "prompt", "top_logprobs", "max_tool_calls"):
        if getattr(req, name) is not None:
            raise invalid_arg(f"`{name}` is not supported")
    if req.truncation not in (None, "disabled", "auto"):
        raise invalid_arg(f"truncation: Input should be 'auto' or 'disabled', got '{req.truncation}'")
    if isinstance(req.input, list):
        if not req.input:
            raise invalid_arg("input: at least one input item is required")
        llm_limits.check_messages(len(req.input))
        llm_limits.check_message_parts(sum(len(item.content) if isinstance(item.content, list) else 0
                                           for item in req.input))
    elif not req.input and req.previous_response_id is None:
        raise invalid_arg("input: must be non-empty")
    check_tools(req.tools)
    _check_metadata(req.metadata)


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if not metadata:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid_arg(f"metadata: at most {MAX_METADATA_PAIRS} key-value pairs, got {len(metadata)}")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise invalid_arg(f"metadata: a key of at most {MAX_METADATA_KEY_CHARS} characters, got {len(key)}")
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise invalid_arg(f"metadata.{key}: a value of at most {MAX_METADATA_VALUE_CHARS} characters, got "
                              f"{len(value)}")


def input_messages(req: ResponsesRequest) -> list[ChatMessage]:
    """The request's ``input`` as chat messages (without the instructions and any stored conversation)."""
    if isinstance(req.input, str):
        return [ChatMessage("user", req.input)]
    out: list[ChatMessage] = []
    for i, item in enumerate(req.input):
        _item(i, item, out)
    return out


def _item(i: int, item: Item, out: list[ChatMessage]) -> None:
    kind = item.type or "message"
    where = f"input[{i}]"
    if kind == "message":
        role = _ROLES.get(item.role or "")
        if role is None:
            raise invalid_arg(f"{where}.role: Input should be 'user', 'assistant', 'system' or 'developer', got "
                              f"'{item.role}'")
        out.append(ChatMessage(role, _text(where + ".content", item.content)))
    elif kind == "function_call":
        if not item.call_id or not item.name:
            raise invalid_arg(f"{where}: a `function_call` item needs `call_id` and `name`")
        call = MessageToolCall(CalledFunction(item.name, item.arguments or "{}"), item.call_id)
        last = out[-1] if out else None
        if last is not None and last.role == "assistant":  # calls in a row, or after its text: one turn
            last.tool_calls = [*(last.tool_calls or []), call]
        else:
            out.append(ChatMessage("assistant", "", tool_calls=[call]))
    elif kind == "function_call_output":
        if not item.call_id:
            raise invalid_arg(f"{where}: a `function_call_output` item needs `call_id`")
        out.append(ChatMessage("tool", _text(where + ".output", item.output), tool_call_id=item.call_id))
    elif kind in _SKIPPED_ITEMS:
        return
    else:
        raise invalid_arg(f"{where}: input items of type '{kind}' are not supported: message, function_call, "
                          "function_call_output and reasoning are")


def _text(where: str, content: str | list[Part] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.type not in _TEXT_PARTS:
            raise invalid_arg(f"{where}[{j}]: content parts of type '{part.type}' are not supported: input_text "
                              "and output_text are")
        texts.append(part.text if part.text is not None else part.refusal or "")
    return joined(texts)


def chat_request(req: ResponsesRequest, history: list[ChatMessage], session: str | None) -> ChatRequest:
    """The chat request ``req`` means after the stored conversation ``history`` (module docstring)."""
    messages: list[ChatMessage] = []
    if req.instructions:
        messages.append(ChatMessage("system", req.instructions))
    # OpenAI's: instructions do not carry over, so a stored conversation holds none (``conversation``).
    messages += history
    messages += input_messages(req)
    llm_limits.check_messages(len(messages))
    tools = [_tool(i, tool) for i, tool in enumerate(req.tools)] if req.tools else None
    chat = ChatRequest(model=req.model, messages=messages, tools=tools, tool_choice=_choice(req.tool_choice),
                       parallel_tool_calls=req.parallel_tool_calls, response_format=_format(req.text))
    return sampled(chat, max_tokens=req.max_output_tokens, stream=req.stream, temperature=req.temperature,
                   top_p=req.top_p, user=req.user, session=session)


def conversation(chat: ChatRequest) -> list[ChatMessage]:
    """What a follow-up continues of a request's messages: all but the instructions (system messages the
    ``instructions`` made), which OpenAI does not carry over."""
    return [m for m in chat.messages if m.role != "system"]


def _tool(i: int, tool: Tool) -> ToolDefinition:
    if tool.type != "function":
        raise invalid_arg(f"tools[{i}]: tools of type '{tool.type}' are not supported: this server runs no hosted "
                          "tools, only function tools")
    if not tool.name:
        raise invalid_arg(f"tools[{i}].name: Field required")
    return ToolDefinition(FunctionDefinition(tool.name, tool.description, tool.parameters, tool.strict))


def _choice(choice: str | ToolChoice | None) -> str | NamedToolChoice | None:
    if choice is None or isinstance(choice, str):
        if choice not in (None, "none", "auto", "required"):
            raise invalid_arg(f"tool_choice: Input should be 'none', 'auto' or 'required', got '{choice}'")
        return choice
    if choice.type != "function":
        raise invalid_arg(f"tool_choice: a choice of type '{choice.type}' is not supported: 'function' is")
    if not choice.name:
        raise invalid_arg("tool_choice.name: Field required")
    return named_tool(choice.name)


def _format(text: TextConfig | None) -> ResponseFormat | None:
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat("json_object")
    if fmt.type == "json_schema":
        if fmt.schema is None:
            raise invalid_arg("text.format.schema: Field required")
        return schema_format(fmt.schema, fmt.name, fmt.strict, fmt.description)
    raise invalid_arg(f"text.format.type: Input should be 'text', 'json_object' or 'json_schema', got '{fmt.type}'")
