"""Tool calling on ``/v1/chat/completions``: which tools a request offers, and how its answer must call
them.

``tool_choice`` decides what shapes the answer:

* a named function, and ``required``: the engine's guided decoding forces the shape, as vLLM's server
  does it (``get_json_schema_from_tools``): the named function's parameter schema (the text *is* the
  arguments), or an array of ``{"name", "parameters"}`` objects, one ``anyOf`` branch per tool. The
  model's answer is a call whose arguments fit the schema; as vLLM, only a model with a tool-call parser
  (its ``TOOL_CALL_PARSER``) takes these, a model without one refuses them in vLLM's words.
* ``auto`` (the default when tools are given): the model writes what it likes, and its tool-call parser
  (the model's ``TOOL_CALL_PARSER`` parameter) finds the calls in the text. Without a parser this is
  refused, as vLLM refuses it without ``--tool-call-parser``.
* ``none``: the tools reach the template, the text is the answer's content.

The model's text is read back by the readers of ``tool_parsers/`` (``forced.py`` for a named function and
``required``, the model's parser for ``auto``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from conveyor.ingress.openai.schema import ChatRequest, NamedToolChoice, ToolDefinition
from conveyor.ingress.openai.tool_parsers import PARSERS
from conveyor.ingress.openai.tool_parsers.base import CallReader, Mode
from conveyor.ingress.openai.tool_parsers.forced import CallArray, NamedCall
from conveyor.proto import llm_limits
from conveyor.proto.errors import internal, invalid_arg

# The model config parameter naming the model's tool-call parser (``auto`` needs one).
PARSER_PARAMETER = "TOOL_CALL_PARSER"
# Triton's OpenAI frontend's parser names (its --tool-call-parser) that vLLM names otherwise.
TRITON_PARSERS = {"llama3": "llama3_json"}
_WHERE = f"here: --tool-call-parser, or the model's '{PARSER_PARAMETER}' parameter in its config.pbtxt"
# OpenAI's rule for a function's name.
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}
# As vLLM, these parsers' markers are special tokens in their models' vocabularies: skipped, no call is seen.
_KEEPS_SPECIAL_TOKENS = ("hermes", "mistral", "granite", "jamba")


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request's tools mean for its prompt, its sampling and the reading of its answer."""

    mode: Mode
    template_tools: list[dict[str, Any]]  # the ``tools`` the chat template gets, in OpenAI's shape
    constraint: dict[str, Any] | None  # guided decoding (vLLM's ``structured_outputs``) that forces the calls
    named: str = ""  # the function a named tool_choice calls
    parser: str = ""  # ``auto``: the model's parser

    def apply(self, params: dict[str, Any]) -> None:
        """Into the request's sampling parameters: the constraint, and what the parser needs of the text."""
        if self.constraint is not None:
            if "structured_outputs" in params:
                raise invalid_arg("`tool_choice` 'required' or a named function is enforced by guided decoding: "
                                  "it cannot be combined with `response_format` or `structured_outputs`")
            params["structured_outputs"] = {"json": self.constraint}
        elif self.mode == "auto" and self.parser in _KEEPS_SPECIAL_TOKENS:
            params["skip_special_tokens"] = False

    def reader(self) -> CallReader | None:
        """A reader of one choice's text, or None when the text is plain content."""
        if self.mode == "named":
            return NamedCall(self.named)
        if self.mode == "required":
            return CallArray()
        if self.mode == "auto":
            return PARSERS[self.parser]()
        return None


def plan(req: ChatRequest, parser: str) -> ToolPlan | None:
    """The request's tools checked (400s) and what they ask for; None without tools. ``parser``: the
    model's ``TOOL_CALL_PARSER`` ("" when it has none)."""
    choice = req.tool_choice
    if not req.tools:
        if choice is None or choice == "none":
            return None
        raise invalid_arg("`tool_choice` needs `tools`")
    check_tools(req.tools)
    tools = {_checked(i, tool): tool for i, tool in enumerate(req.tools)}
    if len(tools) < len(req.tools):
        raise invalid_arg("`tools` names a function twice")
    template_tools = [_wire(tool) for tool in req.tools]
    if isinstance(choice, NamedToolChoice):
        if choice.type != "function":
            raise invalid_arg(f"`tool_choice` of type '{choice.type}' is not supported: expected 'function'")
        tool = tools.get(choice.function.name)
        if tool is None:
            raise invalid_arg(f"`tool_choice` names the function '{choice.function.name}', which is not in "
                              f"`tools` ({', '.join(tools)})")
        _needs_parser(parser, f'function "{choice.function.name}"')
        return ToolPlan("named", template_tools, _parameters(tool), named=choice.function.name)
    mode = choice or "auto"
    if mode == "none":
        return ToolPlan("none", template_tools, None)
    if mode == "required":
        _needs_parser(parser, '"required"')
        constraint = _array_schema(req.tools, req.parallel_tool_calls)
        llm_limits.check_schema(constraint)  # the tools' schemas, nested a few levels deeper
        return ToolPlan("required", template_tools, constraint)
    if mode != "auto":
        raise invalid_arg(f"`tool_choice` '{mode}' is not one of 'none', 'auto', 'required' or a named function")
    if not parser:
        # vLLM's words, then where Conveyor's model names its parser
        raise invalid_arg(f"\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set "
                          f"({_WHERE})")
    if parser not in PARSERS:
        raise internal(f"the model's {PARSER_PARAMETER} '{parser}' is not a tool-call parser this server has "
                       f"({', '.join(sorted(PARSERS))})")
    return ToolPlan("auto", template_tools, None, parser=parser)


def check_tools(tools: list[ToolDefinition]) -> None:
    """All of a request's tools within ``proto/llm_limits.py``'s bounds, together: each reaches the prompt,
    and ``required`` compiles them all into one grammar."""
    if len(tools) > llm_limits.MAX_TOOLS:
        raise invalid_arg(f"`tools` holds {len(tools)} tools; at most {llm_limits.MAX_TOOLS} are taken per request")
    budget = llm_limits.SchemaBudget("`tools`")
    for tool in tools:
        fn = tool.function
        budget.add_text(fn.name)
        budget.add_text(fn.description)
        if fn.parameters is not None:
            budget.add(fn.parameters)


def _needs_parser(parser: str, choice: str) -> None:
    """vLLM's refusal of a forced call on a model without a tool-call parser, in its words."""
    if not parser:
        raise invalid_arg(f"tool_choice={choice} requires --tool-call-parser to be set ({_WHERE})")


def _checked(i: int, tool: ToolDefinition) -> str:
    if tool.type != "function":
        raise invalid_arg(f"tools[{i}]: only tools of type 'function' are supported, got '{tool.type}'")
    name = tool.function.name
    if not _NAME.match(name):
        raise invalid_arg(f"tools[{i}]: the function name '{name}' must be 1 to 64 letters, digits, "
                          "underscores or dashes")
    params = tool.function.parameters
    if params is not None and params.get("type", "object") != "object":
        raise invalid_arg(f"tools[{i}]: the parameters of '{name}' must be a JSON schema of an object")
    return name


def _wire(tool: ToolDefinition) -> dict[str, Any]:
    fn = tool.function
    doc: dict[str, Any] = {"name": fn.name}
    if fn.description is not None:
        doc["description"] = fn.description
    if fn.parameters is not None:
        doc["parameters"] = fn.parameters
    return {"type": "function", "function": doc}


def _parameters(tool: ToolDefinition) -> dict[str, Any]:
    # As vLLM: no parameters still constrains the arguments to a JSON object.
    return tool.function.parameters or _EMPTY_OBJECT


def _array_schema(tools: list[ToolDefinition], parallel: bool | None) -> dict[str, Any]:
    """vLLM's schema for ``required``: one or more ``{"name", "parameters"}`` objects, one branch per tool;
    at most one with ``parallel_tool_calls`` false. The tools' ``$defs`` are lifted to the top, where the
    branches' references find them."""
    defs: dict[str, Any] = {}
    branches = []
    for tool in tools:
        params = dict(_parameters(tool))
        for name, sub in (params.pop("$defs", None) or {}).items():
            if defs.setdefault(name, sub) != sub:
                raise invalid_arg(f"`$defs` '{name}' has different schemas in different tools")
        branches.append({"properties": {"name": {"type": "string", "enum": [tool.function.name]},
                                        "parameters": params},
                         "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": branches}}
    if parallel is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


