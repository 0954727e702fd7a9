"""What one request to a large language model may ask for: the bounds every LLM route checks before it
allocates anything per choice, prompt, stop string, message or tool, and before a guided-decoding
constraint reaches the engine's grammar compiler.

The routes: the OpenAI ingress (``/v1/completions``, ``/v1/chat/completions``, ``/tokenize``), Triton's
``generate`` and ``generate_stream`` for a vLLM model (``ingress/http/generate.py``), and the vLLM backend's
sampling parameters on every protocol (``workers/backends/vllm/request.py``: KServe infer, gRPC, generate).
Each refusal is a 400 (INVALID_ARG), at once.

vLLM's own values where it has them (its server's defaults, read from the same environment variables
vLLM reads, so that raising one raises it here and in the engine alike), in vLLM's words; Conveyor's,
stricter, where vLLM has none. The schema limits bound what xgrammar's compile costs: it has no time
budget (vllm#54003) and cannot be stopped once started, so a costly schema must be refused before it is
sent. Measured on a 2-core host with a 32,000-token vocabulary: 1,000 optional properties in one object
took 2.9 s to compile, 12,000 never finished; every schema inside these limits compiled in under 0.3 s.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from conveyor.proto.errors import invalid_arg


def _vllm_env(name: str, default: int) -> int:
    """vLLM's knob ``name`` as vLLM reads it (its default when unset or not a number)."""
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


# The range of an integer the engine's transport (MessagePack) and vLLM's server (``seed``, ``priority``:
# ``ge=-2**63, le=2**63-1``) take; past it vLLM's engine fails the request (a 500, not a 400).
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# vLLM's VLLM_MAX_N_SEQUENCES: sequences of one prompt. The OpenAI ingress holds a text per choice.
MAX_N = _vllm_env("VLLM_MAX_N_SEQUENCES", 16384)
# The choices of one answer (``n`` times the prompts): each a text, a finish reason and its logprobs the
# OpenAI ingress holds and renders; vLLM has no bound of its own (1,024 prompts of 16,384).
MAX_CHOICES = MAX_N
# vLLM's VLLM_MAX_COMPLETION_PROMPTS: each prompt of a completion request is an engine request of its own.
MAX_PROMPTS = _vllm_env("VLLM_MAX_COMPLETION_PROMPTS", 1024)
# vLLM's default ``max_logprobs``: alternatives per token (``logprobs``, ``top_logprobs``, ``prompt_logprobs``).
MAX_LOGPROBS = 20
# vLLM's VLLM_MAX_STOP_STRINGS (OpenAI's limit too), on the OpenAI routes: each stop string is searched for
# after every token.
MAX_STOP_STRINGS = _vllm_env("VLLM_MAX_STOP_STRINGS", 4)
# Conveyor's, on Triton's routes (generate, ``sampling_parameters``): Triton's vllm_backend hands any number to
# the engine, so requests written for it may carry more than vLLM's server takes; this many keeps the search
# after every token cheap (100,000 took 1.3 s of the engine's time per request).
MAX_BACKEND_STOP_STRINGS = 256
# Conveyor's: a stop string (or a bad word) this long is no real stop sequence, and the engine holds back
# that much of a stream's text to match it.
MAX_STOP_CHARS = 1024
# Conveyor's: ``stop_token_ids`` (vLLM bounds only the bad words' tokens: VLLM_MAX_BAD_WORDS_TOTAL_TOKENS,
# 1,024); the engine checks each id against its vocabulary.
MAX_STOP_TOKEN_IDS = 1024
# vLLM's VLLM_MAX_NUM_BAD_WORDS; it counts them after tokenization, where each word is at least one.
MAX_BAD_WORDS = _vllm_env("VLLM_MAX_NUM_BAD_WORDS", 128)
# Conveyor's: ``allowed_token_ids`` longer than the largest common vocabulary (Gemma's 256k) repeat ids.
MAX_ALLOWED_TOKEN_IDS = 1 << 18
# Conveyor's (OpenAI's own limit on ``messages``): the chat template renders each message.
MAX_MESSAGES = 2048
# Conveyor's: content parts and earlier tool calls over all messages, each decoded and rendered.
MAX_MESSAGE_PARTS = 2048
# Conveyor's (OpenAI's own limit on ``tools``): every tool reaches the template, and ``required`` compiles
# them all into one grammar.
MAX_TOOLS = 128
# vLLM's MAX_STRUCTURED_OUTPUT_JSON_NESTING: objects and arrays nested in a schema (its grammar's cost grows
# steeply with nesting) and in a tool call's arguments (orjson, the template's ``tojson``, recursion).
MAX_JSON_DEPTH = 64
# vLLM's STRUCTURAL_TAG_WRAPPER_NESTING: the more a structural tag may nest, its tags around its schemas.
STRUCTURAL_TAG_DEPTH = MAX_JSON_DEPTH + 16
# Conveyor's: JSON values (objects, arrays, strings, numbers) in one schema or all of a request's tools;
# ``oneOf`` branches copied into each other grow a schema exponentially (a 10-level copy: 10,000 values,
# 0.16 s to compile; 12 levels: 4.7 s).
MAX_SCHEMA_NODES = 8192
# Conveyor's: properties over a whole schema, and in one object; optional properties cost the compile
# about cubically (one object of 256: 0.04 s; of 1,000: 2.9 s; 20 objects of 200: 6.7 s; 4 of 256: 0.24 s).
MAX_SCHEMA_PROPERTIES = 1024
MAX_OBJECT_PROPERTIES = 256
# OpenAI's structured-outputs limit: ``enum`` values over a whole schema.
MAX_SCHEMA_ENUM_VALUES = 1000
# Conveyor's, near OpenAI's 120,000 (names and enum values only; here every string: descriptions too, which
# reach the prompt): characters of the strings in one schema, or in all of a request's tools.
MAX_SCHEMA_CHARS = 120_000
# Conveyor's: an ambiguous regex compiles in about quadratic time in its length ("(a|b|ab)*" 30 times:
# 0.15 s; 100 times, 900 characters: 1.4 s); vLLM's own 5 s regex timeout stops waiting, not compiling.
MAX_REGEX_CHARS = 1024
# Conveyor's: a grammar (EBNF or Lark) or a structural tag; an ambiguous one costs as a regex (2,000
# characters of ``("a" | "b" | "ab")*``: 1.3 s; 4,000: 6 s).
MAX_GRAMMAR_CHARS = 4096
# Conveyor's: ``structured_outputs.choice`` options, each a branch of one grammar, as ``enum`` values.
MAX_CHOICE_OPTIONS = MAX_SCHEMA_ENUM_VALUES
# Conveyor's: JSON values in one request body, counted before it is decoded (every value after the first in
# an array or object follows a comma): decoding allocates a Python object per value (a megabyte of "a",
# strings, ~40 MB). Four million: a million-token prompt of ids four times over.
MAX_BODY_VALUES = 1 << 22

# Conveyor's, on the images of one request (the vLLM backend's ``image`` input, the OpenAI chat route's
# ``image_url`` parts), checked before anything is decoded or reaches an engine (the engine then applies its own
# ``limit_mm_per_prompt``). Items: each is decoded, resized and run through the vision tower.
MAX_MEDIA_ITEMS = 16
# The encoded bytes of one image (a photo's JPEG is a few MB; the whole request stays in shared memory).
MAX_MEDIA_BYTES = 20 << 20
# Its base64 text: 4 characters for every 3 bytes.
MAX_MEDIA_B64_CHARS = (MAX_MEDIA_BYTES + 2) // 3 * 4
# Pixels of one decoded image (a 1-KB PNG can declare 10^9 pixels: gigabytes once decoded); 8,192 x 4,096, well
# past any vision tower's input, which the processor resizes to (Pillow's own bomb check starts at 89 M).
MAX_IMAGE_PIXELS = 1 << 25
# The formats an image may be in: the common ones Pillow decodes natively; the rarer ones (PSD, ICNS, FITS, ...)
# are more parser surface than any client needs.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")

_CHECKS: dict[str, Callable[[str, Any], None]] = {}


def check_body_values(body: bytes) -> None:
    """Before decoding ``body``: at most ``MAX_BODY_VALUES`` JSON values (commas counted, those in strings
    too: an upper bound)."""
    commas = body.count(b",")
    if commas >= MAX_BODY_VALUES:
        raise invalid_arg(f"the request holds more than {MAX_BODY_VALUES} JSON values ({commas + 1} at most); "
                          "this server decodes no more per request")


def check_n(n: int) -> None:
    """vLLM's bounds of ``n``, in its words."""
    if n < 1:
        raise invalid_arg(f"n must be at least 1, got {n}.")
    if n > MAX_N:
        raise invalid_arg(f"n must be at most {MAX_N}, got {n}. To increase this limit, set the "
                          "VLLM_MAX_N_SEQUENCES environment variable.")


def check_choices(n: int, prompts: int) -> None:
    if n * prompts > MAX_CHOICES:
        raise invalid_arg(f"n ({n}) times the prompts ({prompts}) asks for {n * prompts} choices; one request may "
                          f"have at most {MAX_CHOICES}")


def check_prompts(count: int, field: str = "prompt", limit: int = MAX_PROMPTS) -> None:
    """vLLM's bound of a list of prompts, in its words (``limit``: another route's, as embeddings')."""
    if count > limit:
        knob = (" To increase this limit, set the VLLM_MAX_COMPLETION_PROMPTS environment variable."
                if limit == MAX_PROMPTS else "")
        raise invalid_arg(f"{field} list length {count} exceeds the maximum allowed count of {limit}.{knob}")


def check_messages(messages: int) -> None:
    if messages > MAX_MESSAGES:
        raise invalid_arg(f"`messages` holds {messages} messages; at most {MAX_MESSAGES} are taken per request")


def check_message_parts(parts: int) -> None:
    if parts > MAX_MESSAGE_PARTS:
        raise invalid_arg(f"`messages` hold {parts} content parts and tool calls; at most {MAX_MESSAGE_PARTS} are "
                          "taken per request")


def check_logprobs(name: str, value: int, limit: int | None) -> None:
    """``logprobs`` / ``top_logprobs`` / ``prompt_logprobs``: vLLM's checks, in its words; ``limit``: the
    engine's ``max_logprobs`` where the caller knows it (None: the engine checks against its own)."""
    if value < 0 and value != -1:
        raise invalid_arg(f"`{name}` must be a positive value or -1.")
    if limit is not None and (value == -1 or value > limit):
        kind = "prompt" if name == "prompt_logprobs" else "sample"
        asked = "-1 (the whole vocabulary)" if value == -1 else str(value)
        raise invalid_arg(f"Requested {kind} logprobs of {asked}, which is greater than max allowed: {limit}")


def check_int64(name: str, value: int) -> None:
    """As vLLM's server's ``seed`` and ``priority`` fields (pydantic's words)."""
    if value > INT64_MAX:
        raise invalid_arg(f"{name}: Input should be less than or equal to {INT64_MAX}")
    if value < INT64_MIN:
        raise invalid_arg(f"{name}: Input should be greater than or equal to {INT64_MIN}")


def check_depth(value: Any, what: str, limit: int = MAX_JSON_DEPTH) -> None:
    """At most ``limit`` levels of objects and arrays (vLLM's count), in vLLM's words ("The JSON schema is
    nested too deeply: ..."); level by level, no recursion."""
    level = [value]
    for _ in range(limit):
        level = [child for node in level if isinstance(node, dict | list)
                 for child in (node.values() if isinstance(node, dict) else node) if isinstance(child, dict | list)]
        if not level:
            return
    raise invalid_arg(f"{what} is nested too deeply: objects and arrays may nest at most {limit} levels")


class SchemaBudget:
    """What one or more JSON schemas may hold together (a constraint, or all of a request's tools), counted
    as they are added: depth, values, properties (in all and per object), ``enum`` values and string
    characters. Raises as soon as one is over, without recursion."""

    __slots__ = ("chars", "enums", "nodes", "properties", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.nodes = self.properties = self.enums = self.chars = 0

    def add_text(self, text: str | None) -> None:
        """A string that comes with the schemas (a tool's name or description)."""
        if text:
            self.chars += len(text)
            self._check_chars()

    def add(self, schema: Any, depth_limit: int = MAX_JSON_DEPTH) -> None:
        """One schema, walked depth first with no recursion; a hostile one costs at most the limits' worth
        of values, however large it is."""
        stack: list[tuple[Any, int]] = [(schema, 1)]
        while stack:
            node, depth = stack.pop()
            self.nodes += 1
            if isinstance(node, dict | list) and depth > depth_limit:  # vLLM's count and words
                raise invalid_arg(f"{self.what} is nested too deeply: objects and arrays may nest at most "
                                  f"{depth_limit} levels")
            if isinstance(node, dict):
                self._check(2 * len(node))  # its keys and values, before any is read
                self.nodes += len(node)  # its keys
                self.chars += sum(len(k) for k in node if isinstance(k, str))
                properties = node.get("properties")
                if isinstance(properties, dict):
                    self._properties(len(properties))
                values = node.get("enum")
                if isinstance(values, list):
                    self.enums += len(values)
                    if self.enums > MAX_SCHEMA_ENUM_VALUES:
                        raise invalid_arg(f"{self.what} has more than {MAX_SCHEMA_ENUM_VALUES} `enum` values")
                self._check_chars()
                stack.extend((child, depth + 1) for child in node.values())
            elif isinstance(node, list):
                self._check(len(node))
                stack.extend((child, depth + 1) for child in node)
            else:
                if isinstance(node, str):
                    self.chars += len(node)
                self._check(0)

    def _check(self, children: int) -> None:
        """The counts so far, and a container's ``children`` before they are walked."""
        if self.nodes + children > MAX_SCHEMA_NODES:
            raise invalid_arg(f"{self.what} holds more than {MAX_SCHEMA_NODES} JSON values; this server "
                              "compiles no larger schema")
        self._check_chars()

    def _properties(self, count: int) -> None:
        if count > MAX_OBJECT_PROPERTIES:
            raise invalid_arg(f"{self.what} has an object of {count} properties; at most {MAX_OBJECT_PROPERTIES} "
                              "are taken per object")
        self.properties += count
        if self.properties > MAX_SCHEMA_PROPERTIES:
            raise invalid_arg(f"{self.what} has more than {MAX_SCHEMA_PROPERTIES} properties in all")

    def _check_chars(self) -> None:
        if self.chars > MAX_SCHEMA_CHARS:
            raise invalid_arg(f"{self.what} holds more than {MAX_SCHEMA_CHARS} characters of strings")


def check_schema(schema: Any, what: str = "The JSON schema", depth_limit: int = MAX_JSON_DEPTH) -> None:
    SchemaBudget(what).add(schema, depth_limit)


def check_constraint(spec: Any) -> None:
    """A guided-decoding constraint (vLLM's ``StructuredOutputsParams`` as a JSON object, or its text):
    its schema, regex, grammar, choices or structural tag within the limits above. What is not a
    constraint's shape is left to the engine's own refusal."""
    if isinstance(spec, str):
        spec = _loads(spec, "structured_outputs", MAX_SCHEMA_CHARS + MAX_GRAMMAR_CHARS)
    if not isinstance(spec, dict):
        return
    schema = spec.get("json")
    if isinstance(schema, str):
        schema = _loads(schema, "structured_outputs.json", MAX_SCHEMA_CHARS)
    if schema is not None:
        check_schema(schema, "The JSON schema")
    for name, limit in (("regex", MAX_REGEX_CHARS), ("whitespace_pattern", MAX_REGEX_CHARS),
                        ("grammar", MAX_GRAMMAR_CHARS)):
        text = spec.get(name)
        if isinstance(text, str) and len(text) > limit:
            raise invalid_arg(f"structured_outputs.{name} has {len(text)} characters; at most {limit} are taken")
    choice = spec.get("choice")
    if isinstance(choice, list):
        if len(choice) > MAX_CHOICE_OPTIONS:
            raise invalid_arg(f"structured_outputs.choice has {len(choice)} options; at most {MAX_CHOICE_OPTIONS} "
                              "are taken")
        if sum(len(c) for c in choice if isinstance(c, str)) > MAX_SCHEMA_CHARS:
            raise invalid_arg(f"structured_outputs.choice holds more than {MAX_SCHEMA_CHARS} characters")
    tag = spec.get("structural_tag")
    if isinstance(tag, str):
        if len(tag) > MAX_SCHEMA_CHARS:
            raise invalid_arg(f"structured_outputs.structural_tag has {len(tag)} characters; at most "
                              f"{MAX_SCHEMA_CHARS} are taken")
        check_schema(_loads(tag, "structured_outputs.structural_tag", MAX_SCHEMA_CHARS), "The structural tag",
                     STRUCTURAL_TAG_DEPTH)


def _loads(text: str, what: str, limit: int) -> Any:
    """A constraint's JSON text; None when it is not JSON (the engine refuses it in its words)."""
    if len(text) > limit:
        raise invalid_arg(f"{what} has {len(text)} characters; at most {limit} are taken")
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        if "recursion" in str(exc) or "depth" in str(exc):
            raise invalid_arg(f"{what} is nested too deeply: objects and arrays may nest at most "
                              f"{MAX_JSON_DEPTH} levels") from None
        return None


def check_sampling(values: Mapping[str, Any], *, max_logprobs: int | None = None,
                   max_stop_strings: int = MAX_BACKEND_STOP_STRINGS) -> None:
    """vLLM's sampling parameters (``SamplingParams``' names; ``structured_outputs`` or Triton's
    ``guided_decoding`` as an object or its text) within the limits above. Values may be the text of a
    number (Triton's request parameters); a value of the wrong type is left to the engine's refusal.
    ``max_logprobs``: the engine's, where the caller knows it; ``max_stop_strings``: the route's."""
    for name, value in values.items():
        if value is None:
            continue
        if name == "stop":
            _stop(value, max_stop_strings)
            continue
        if name in ("logprobs", "prompt_logprobs"):
            number = _integer(value)
            if number is not None:
                check_int64(name, number)
                check_logprobs(name, number, max_logprobs)
            continue
        check = _CHECKS.get(name)
        if check is not None:
            check(name, value)


def _integer(value: Any) -> int | None:
    """``value`` as the integer the backend makes of it (Triton's text parameters; orjson reads an integer
    past 64 bits as a float); None where it makes none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _n(name: str, value: Any) -> None:
    number = _integer(value)
    if number is not None:
        check_n(number)


def _int64(name: str, value: Any) -> None:
    number = _integer(value)
    if number is not None:
        check_int64(name, number)


def _stop(value: Any, limit: int) -> None:
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list):
        return
    if len(strings) > limit:
        raise invalid_arg(f"stop: List should have at most {limit} items after validation, not {len(strings)}")
    _lengths("stop", strings)


def _bad_words(name: str, value: Any) -> None:
    if not isinstance(value, list):
        return
    if len(value) > MAX_BAD_WORDS:  # vLLM's words, for the words it counts after tokenizing
        raise invalid_arg(f"Too many bad words after tokenization: {len(value)}. The max number is {MAX_BAD_WORDS}.")
    _lengths(name, value)


def _lengths(name: str, strings: list[Any]) -> None:
    longest = max((len(s) for s in strings if isinstance(s, str)), default=0)
    if longest > MAX_STOP_CHARS:
        raise invalid_arg(f"{name}: each string may have at most {MAX_STOP_CHARS} characters, got one of {longest}")


def _token_ids(limit: int) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if not isinstance(value, list):
            return
        if len(value) > limit:
            raise invalid_arg(f"{name} holds {len(value)} token ids; at most {limit} are taken")
        for token in value:
            number = _integer(token)
            if number is not None:
                check_int64(name, number)
    return check


def _constraint(name: str, value: Any) -> None:
    check_constraint(value)


_CHECKS.update({
    "n": _n,
    "bad_words": _bad_words,
    "stop_token_ids": _token_ids(MAX_STOP_TOKEN_IDS),
    "allowed_token_ids": _token_ids(MAX_ALLOWED_TOKEN_IDS),
    "structured_outputs": _constraint,
    "guided_decoding": _constraint,  # Triton's vllm_backend's name of it
    **{name: _int64 for name in ("seed", "max_tokens", "min_tokens", "top_k", "priority", "truncate_prompt_tokens",
                                 "stream_interval", "thinking_token_budget")},
})



def check_media_items(count: int, field: str) -> None:
    if count > MAX_MEDIA_ITEMS:
        raise invalid_arg(f"{field}: {count} images; at most {MAX_MEDIA_ITEMS} are taken per request")


def check_media_b64(chars: int, field: str) -> None:
    """One item's base64 text, before it is decoded."""
    if chars > MAX_MEDIA_B64_CHARS:
        raise invalid_arg(f"{field}: an image of {chars} base64 characters; at most {MAX_MEDIA_B64_CHARS} "
                          f"({MAX_MEDIA_BYTES} bytes) are taken")
