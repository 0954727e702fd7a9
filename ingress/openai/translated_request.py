"""What the request bodies read as a chat request share (``responses_schema.py``: OpenAI's Responses,
``messages_schema.py``: Anthropic's Messages): the bound on tools, the tool choice that names a function,
structured outputs by a JSON schema, content parts joined into a message's text, and the sampling settings
both APIs give. Each API's own fields and words stay in its module.
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from typing import Any

import msgspec

from conveyor.ingress.openai.schema import (
    ChatRequest,
    JsonSchema,
    NamedToolChoice,
    ResponseFormat,
    ToolChoiceFunction,
)
from conveyor.proto import llm_limits
from conveyor.proto.errors import invalid_arg


class ToolChoice(msgspec.Struct):
    """A ``tool_choice`` object: its ``type``, and the tool it names where it names one."""

    type: str
    name: str | None = None


def check_tools(tools: Sized | None) -> None:
    """The request's tools, counted before any is read (``llm_limits.MAX_TOOLS``)."""
    if tools and len(tools) > llm_limits.MAX_TOOLS:
        raise invalid_arg(f"tools: {len(tools)} tools; at most {llm_limits.MAX_TOOLS} are taken per request")


def named_tool(name: str) -> NamedToolChoice:
    """The chat route's choice of the function ``name``."""
    return NamedToolChoice(ToolChoiceFunction(name))


def schema_format(schema: dict[str, Any], name: str | None = None, strict: bool | None = None,
                  description: str | None = None) -> ResponseFormat:
    """Structured outputs that follow ``schema``, as chat's ``response_format`` ``json_schema``."""
    return ResponseFormat("json_schema", JsonSchema(name, schema, strict, description))


def joined(texts: Iterable[str]) -> str:
    """Text parts as one message's text: joined by newlines, as a chat message's text parts are."""
    return "\n".join(texts)


def sampled(chat: ChatRequest, *, max_tokens: int | None, stream: bool, temperature: float | None,
            top_p: float | None, user: str | None, session: str | None) -> ChatRequest:
    """``chat`` with the settings both APIs give: the sampling parameters, the answer streamed or not, the
    user, and the session (``prompt_cache_key``) that keeps a conversation's turns on one engine."""
    chat.max_tokens = max_tokens
    chat.stream = stream
    chat.temperature = temperature
    chat.top_p = top_p
    chat.user = user
    chat.prompt_cache_key = session
    return chat
