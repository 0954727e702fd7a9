"""The texts the tool-call parsers' tests read (test_pythonic_mistral.py, test_granite_jamba_xlam.py) and
vLLM's own parsers read the same (test_same_as_vllm.py); the ids each parser gives."""

from __future__ import annotations

from typing import Any

PYTHONIC_CALLS = [
    '[get_weather(city="Paris")]',
    '[get_weather(city="Paris", days=-3), other(x=1)]',
    "[f(a='it''s', b={'k': [1, (2, 3)], 'n': None}, c=true, d=1.5e3)]",
    '[f()]',
    '[f(a="a,b)]", b=\'q"\')]',
    '[f(text="caf\\u00e9 \\"x\\"")]',
]
PYTHONIC_CONTENT = ["hello", "[1] is a citation", " [f(a=1)]", "[f(a=1)] and text", "[f(1)]", "[f(a=g(1))]", "[]"]
MISTRAL_CALLS = [
    'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    '[TOOL_CALLS] [{"name": "f", "arguments": {"a": [1, {"b": "}"}]}}, {"name": "g", "arguments": {}}]',
    '[TOOL_CALLS]{"name": "f", "arguments": {"a": 1}}',
    '[TOOL_CALLS][{"name": "f", "arguments": "{\\"a\\": 1}"}]',
    'x[TOOL_CALLS]get_weather{"city": "Paris"}',
    '[TOOL_CALLS]f[ARGS]{"a": "[TOOL"}[TOOL_CALLS]g{"b": [2]} trailing',
]
MISTRAL_CONTENT = ["plain text", "[TOOL_CALLS][1]", "hi [TOOL_CALLS]{\"x\": 1}", "[TOOL_CALLS][{\"name\": \"f\""]

# parser, text, content, calls (name, arguments as JSON)
CALLS: list[tuple[str, str, str | None, list[tuple[str, Any]]]] = [
    ("granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]', None,
     [("get_weather", {"city": "Paris"})]),
    ("granite", 'Sure. <tool_call> [{"name": "f", "arguments": {"a": [1, {"b": "}]"}]}},\n'
     '{"name": "g", "arguments": {}}] trailing', "Sure.", [("f", {"a": [1, {"b": "}]"}]}), ("g", {})]),
    ("granite", '<|tool_call|>[{"arguments": {"q": "<tool_call>"}, "name": "f"}, {"name": "h"}]', None,
     [("f", {"q": "<tool_call>"}), ("h", {})]),
    ("granite", '<|tool_call|>[{"name": "f", "arguments": "{\\"a\\": \\"caf\\u00e9\\"}"}]', None,
     [("f", {"a": "café"})]),
    ("granite", 'x <|tool_call|> {"y": 1} and <tool_call>[{"name": "f", "arguments": {"n": -1.5e3}}]', 'x {"y": 1} and',
     [("f", {"n": -1.5e3})]),
    ("jamba", 'Let me check. <tool_calls>[{"name": "f", "arguments": {"city": "é\\"}"}}, '
     '{"name": "g", "arguments": {}}]</tool_calls> after', "Let me check. ", [("f", {"city": 'é"}'}), ("g", {})]),
    ("jamba", ' <tool_calls>\n[{"arguments": "text", "name": "f"}]\n</tool_calls>', None, [("f", "text")]),
    ("xlam", '[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": "{\\"b\\": [2]}"}]', None,
     [("f", {"a": 1}), ("g", {"b": [2]})]),
    ("xlam", '<think>which tool?</think>\n[{"name": "f", "arguments": {"a": "]"}}]', "<think>which tool?</think>",
     [("f", {"a": "]"})]),
    ("xlam", 'Sure.\n```json\n[{"name": "f", "arguments": {"a": 1}}]\n```\nDone.', "Sure.\n\nDone.", [("f", {"a": 1})]),
    ("xlam", '```[{"name": "f", "arguments": {}}]```', "", [("f", {})]),
    ("xlam", 'x [TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]\nnext line', "x \nnext line", [("f", {"a": 1})]),
    ("xlam", 'pre <tool_call>[{"name": "f", "arguments": {"a": 1}}, {"name": "skipped"}]</tool_call> post',
     "pre  post", [("f", {"a": 1})]),
]


# parser, text: no calls, the whole text the content
CONTENT: list[tuple[str, str]] = [
    ("granite", "plain text"), ("granite", "ends in <tool_ca"),
    ("jamba", "plain text"), ("jamba", '<tool_calls>[{"name": "f", "arguments": {}}]'),
    ("jamba", '<tool_calls>{"name": "f", "arguments": {}}</tool_calls>'),
    ("jamba", '<tool_calls>[{"name": "f"}]</tool_calls>'),
    ("jamba", 'a <tool_calls>[{"name": 1, "arguments": {}}]</tool_calls>'),
    ("xlam", "plain text"), ("xlam", "see [1] and ```python\nprint(1)\n```"), ("xlam", "[1] is a citation"),
    ("xlam", '[{"name": "f", "arguments": {}}] and more'), ("xlam", '[{"name": 1, "arguments": {}}]'),
]


GRANITE_NO_ARRAY = 'a <|tool_call|> {"name": "f"}'


def check_id(parser: str, id_: str) -> None:
    """The id a call gets, in the form the model's vLLM parser gives."""
    if parser == "mistral":
        assert len(id_) == 9 and id_.isalnum()
    elif parser == "xlam":
        prefix, index, rest = id_.split("_")
        assert prefix == "call" and index.isdigit() and len(rest) == 16
    else:
        assert id_.startswith("chatcmpl-tool-") and len(id_) == len("chatcmpl-tool-") + 16
