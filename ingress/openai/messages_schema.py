"""The request bodies of Anthropic's ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``, decoded
(msgspec, as every body of this ingress) and made into the chat request they mean (``schema.ChatRequest``),
which then takes the chat path whole: the model's chat template, tools and their parser, structured outputs,
adapters, placement and migration (``endpoints.py``), so that the two APIs answer alike (what both share:
``translated_request.py``).

What each field becomes, as vLLM's Anthropic server (``vllm/entrypoints/anthropic``) translates it:

* ``system`` (a string or text blocks) leads the conversation as a ``system`` message; the blocks' texts are
  joined by newlines, as a chat message's text parts are. A block that starts ``x-anthropic-billing-header``
  (Claude Code's, a hash that changes with every request) is left out, as vLLM leaves it out: it would
  change the prompt's first tokens and miss the prefix cache on every turn.
* ``messages``: ``user`` and ``assistant`` turns, the last a ``user`` one (a last ``assistant`` turn, Anthropic's
  prefill of the answer, is a 400: the template would close it, and the answer would be a new turn, not its
  continuation), a string or blocks: ``text`` blocks (joined by newlines),
  an assistant's ``tool_use`` blocks (its ``tool_calls``, ``input`` as the arguments object), a user's
  ``tool_result`` blocks (each a ``tool`` message answering its ``tool_use_id``, before the turn's text), and
  an assistant's ``thinking`` / ``redacted_thinking`` blocks, accepted and left out (the template has no
  place for them). Any other block (``image``, ``document``, server tools' blocks) is a 400.
* ``max_tokens`` (required, as Anthropic requires it), ``stop_sequences``, ``temperature``, ``top_p``,
  ``top_k``: the sampling parameters of the same names (``stop`` for the stop sequences), within the chat
  route's bounds (``proto/llm_limits.py``: at most ``MAX_STOP_STRINGS`` stop sequences).
* ``tools`` (client tools: ``name``, ``description``, ``input_schema``) are function tools; ``tool_choice``
  ``auto``, ``any``, ``tool`` (with ``name``) and ``none`` are ``auto``, ``required``, the named function
  and ``none``; ``disable_parallel_tool_use`` is ``parallel_tool_calls`` false. Server tools (a ``type``
  other than ``custom``: web search, code execution, ...) are a 400: nothing here runs them.
* ``output_config.format`` (``json_schema``) is ``response_format`` ``json_schema``: structured outputs.
* ``metadata.user_id`` is the chat request's ``user``, and its session (``prompt_cache_key``): an agent's
  turns go to one engine (router/scheduling/engine_placement.py), unless ``x-session-id`` names another.
* ``thinking``, ``output_config.effort``, ``service_tier``, ``cache_control`` (on the request, any block or tool) and
  the ``anthropic-version`` / ``anthropic-beta`` headers are accepted and have no effect: the engines have
  no thinking budget nor service tiers, and their prefix cache needs no marks. ``container`` and
  ``mcp_servers`` (tools run by Anthropic's servers) are a 400. Other unknown fields are ignored and logged
  once, as on the other routes (``schema.decode``).

Every count a client chooses is bounded before anything is made per item: the messages
(``llm_limits.MAX_MESSAGES``), the content blocks over the whole request (``MAX_BLOCKS``) and the tools
(``llm_limits.MAX_TOOLS``); the body itself is bounded in bytes and JSON values as on every route.
"""

from __future__ import annotations

from typing import Any

import msgspec

from conveyor.ingress.openai import translated_request
from conveyor.ingress.openai.schema import (
    CalledFunction,
    ChatMessage,
    ChatRequest,
    ContentPart,
    FunctionDefinition,
    MessageToolCall,
    NamedToolChoice,
    ResponseFormat,
    ToolDefinition,
)
from conveyor.ingress.openai.translated_request import (
    check_tools,
    joined,
    named_tool,
    sampled,
    schema_format,
)
from conveyor.proto import llm_limits
from conveyor.proto.errors import invalid_arg

# Content blocks over the system prompt, every message and every tool result's own blocks: each is decoded and
# becomes a part of the conversation the template renders (the chat route's bound on content parts).
MAX_BLOCKS = llm_limits.MAX_MESSAGE_PARTS
# Anthropic's own bound on ``metadata.user_id``: an opaque id, not a text.
MAX_USER_ID_CHARS = 256
# Claude Code's first system block: a per-request hash that would change the prompt's first tokens (vLLM's).
BILLING_HEADER = "x-anthropic-billing-header"

_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # Anthropic's tool_choice -> the chat route's


class InnerBlock(msgspec.Struct):
    """A block of a ``tool_result``'s content."""

    type: str
    text: str | None = None


class Block(msgspec.Struct):
    """One content block: its ``type`` says which fields it has."""

    type: str
    text: str | None = None  # text
    id: str | None = None  # tool_use
    name: str | None = None  # tool_use
    input: dict[str, Any] | None = None  # tool_use: the arguments object
    tool_use_id: str | None = None  # tool_result
    content: str | list[InnerBlock] | None = None  # tool_result
    is_error: bool | None = None  # tool_result (the template has no place for it)


class Message(msgspec.Struct):
    role: str
    content: str | list[Block]


class Tool(msgspec.Struct):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None  # required of a client tool; a server tool has none
    type: str | None = None  # None or "custom": a client tool; anything else a server tool


class ToolChoice(translated_request.ToolChoice):
    disable_parallel_tool_use: bool | None = None


class Metadata(msgspec.Struct):
    user_id: str | None = None


class OutputFormat(msgspec.Struct):
    type: str
    schema: dict[str, Any] | None = None


class OutputConfig(msgspec.Struct):
    format: OutputFormat | None = None
    effort: str | None = None  # no effect: the engines have no such knob


class CountTokensRequest(msgspec.Struct, kw_only=True):
    """``/v1/messages/count_tokens``: what makes the prompt."""

    model: str
    messages: list[Message]
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    thinking: dict[str, Any] | None = None  # no effect (module docstring)
    cache_control: Any = None  # no effect: the engine's prefix cache needs no marks
    mcp_servers: list[Any] | None = None  # refused when given


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: int  # required, as Anthropic requires it
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    service_tier: str | None = None  # no effect
    container: Any = None  # refused when given


def chat_request(req: CountTokensRequest) -> ChatRequest:
    """The chat request ``req`` means (module docstring); 400s for what has no meaning here."""
    if req.mcp_servers:
        raise invalid_arg("`mcp_servers` is not supported: this server runs no MCP connector")
    _check_counts(req)
    messages: list[ChatMessage] = []
    system = _system(req.system)
    if system is not None:
        messages.append(ChatMessage("system", system))
    for i, msg in enumerate(req.messages):
        messages += _turn(i, msg)
    tools = [_tool(i, tool) for i, tool in enumerate(req.tools)] if req.tools else None
    choice: str | NamedToolChoice | None = None
    parallel: bool | None = None
    if req.tool_choice is not None:
        choice = _choice(req.tool_choice)
        if req.tool_choice.disable_parallel_tool_use:
            parallel = False
    chat = ChatRequest(model=req.model, messages=messages, tools=tools, tool_choice=choice,
                       parallel_tool_calls=parallel, response_format=_format(req.output_config))
    if isinstance(req, MessagesRequest):
        if req.container is not None:
            raise invalid_arg("`container` is not supported: this server runs no code execution container")
        user = req.metadata.user_id if req.metadata is not None else None
        if user is not None and len(user) > MAX_USER_ID_CHARS:
            raise invalid_arg(f"metadata.user_id: String should have at most {MAX_USER_ID_CHARS} characters")
        # Anthropic's user keeps its turns on one engine (x-session-id wins).
        sampled(chat, max_tokens=req.max_tokens, stream=req.stream, temperature=req.temperature, top_p=req.top_p,
                user=user, session=user)
        chat.stop = req.stop_sequences
        chat.top_k = req.top_k
    return chat


def _check_counts(req: CountTokensRequest) -> None:
    """The request's counts, before anything is made per message, block or tool."""
    if not req.messages:
        raise invalid_arg("messages: at least one message is required")
    llm_limits.check_messages(len(req.messages))
    if req.messages[-1].role == "assistant":
        # The template would close that turn and open a new one: the answer would not continue it.
        raise invalid_arg("a last message of role 'assistant' (a prefill of the answer) is not supported: the "
                          "conversation must end with a 'user' message")
    blocks = len(req.system) if isinstance(req.system, list) else 0
    for msg in req.messages:
        if isinstance(msg.content, list):
            blocks += len(msg.content)
            blocks += sum(len(b.content) for b in msg.content if isinstance(b.content, list))
    if blocks > MAX_BLOCKS:
        raise invalid_arg(f"the request holds {blocks} content blocks; at most {MAX_BLOCKS} are taken per request")
    check_tools(req.tools)


def _system(system: str | list[Block] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    texts = []
    for i, block in enumerate(system):
        if block.type != "text":
            raise invalid_arg(f"system.{i}: only text blocks are supported in `system`, got '{block.type}'")
        if block.text and not block.text.startswith(BILLING_HEADER):
            texts.append(block.text)
    return joined(texts) or None


def _turn(i: int, msg: Message) -> list[ChatMessage]:
    """One Anthropic message as chat messages: its tool results (each a ``tool`` message), then the turn."""
    if msg.role not in ("user", "assistant"):
        raise invalid_arg(f"messages.{i}.role: Input should be 'user' or 'assistant', got '{msg.role}'")
    if isinstance(msg.content, str):
        return [ChatMessage(msg.role, msg.content)]
    out: list[ChatMessage] = []
    texts: list[ContentPart] = []
    calls: list[MessageToolCall] = []
    for j, block in enumerate(msg.content):
        kind = block.type
        where = f"messages.{i}.content.{j}"
        if kind == "text":
            texts.append(ContentPart("text", block.text or ""))
        elif kind == "tool_use" and msg.role == "assistant":
            if not block.id or not block.name:
                raise invalid_arg(f"{where}: a `tool_use` block needs `id` and `name`")
            calls.append(MessageToolCall(CalledFunction(block.name, block.input or {}), block.id))
        elif kind == "tool_result" and msg.role == "user":
            if not block.tool_use_id:
                raise invalid_arg(f"{where}: a `tool_result` block needs `tool_use_id`")
            out.append(ChatMessage("tool", _result_text(where, block.content), tool_call_id=block.tool_use_id))
        elif kind in ("thinking", "redacted_thinking") and msg.role == "assistant":
            continue  # the model's own reasoning in the history: no template here has a place for it
        elif kind in ("tool_use", "tool_result", "thinking", "redacted_thinking"):
            raise invalid_arg(f"{where}: a `{kind}` block cannot be in a message of role '{msg.role}'")
        else:
            raise invalid_arg(f"{where}: content blocks of type '{kind}' are not supported: text, tool_use and "
                              "tool_result are")
    if texts or calls or not out:
        out.append(ChatMessage(msg.role, texts, tool_calls=calls or None))
    return out


def _result_text(where: str, content: str | list[InnerBlock] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    for block in content:
        if block.type != "text":
            raise invalid_arg(f"{where}: `tool_result` content blocks of type '{block.type}' are not supported: "
                              "text is")
    return joined(block.text or "" for block in content)


def _tool(i: int, tool: Tool) -> ToolDefinition:
    if tool.type not in (None, "custom"):
        raise invalid_arg(f"tools.{i}: tools of type '{tool.type}' are not supported: this server runs no server "
                          "tools, only client tools (`name`, `input_schema`)")
    if tool.input_schema is None:
        raise invalid_arg(f"tools.{i}.input_schema: Field required")
    return ToolDefinition(FunctionDefinition(tool.name, tool.description, tool.input_schema))


def _choice(choice: ToolChoice) -> str | NamedToolChoice:
    if choice.type == "tool":
        if not choice.name:
            raise invalid_arg("tool_choice.name: Field required when tool_choice.type is 'tool'")
        return named_tool(choice.name)
    found = _CHOICES.get(choice.type)
    if found is None:
        raise invalid_arg(f"tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none', got '{choice.type}'")
    return found


def _format(config: OutputConfig | None) -> ResponseFormat | None:
    fmt = config.format if config is not None else None
    if fmt is None:
        return None
    if fmt.type != "json_schema":
        raise invalid_arg(f"output_config.format.type: Input should be 'json_schema', got '{fmt.type}'")
    if fmt.schema is None:
        raise invalid_arg("output_config.format.schema: Field required")
    return schema_format(fmt.schema)
