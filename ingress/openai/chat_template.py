"""A model's own chat template, rendered as Hugging Face ``transformers`` renders it.

The template is the tokenizer's: ``chat_template.jinja`` in the tokenizer folder, else
``chat_template`` in its ``tokenizer_config.json`` (a string, or named templates of
which "default" is used). It is rendered with jinja2's sandbox, with transformers'
settings (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, ``raise_exception``)
and the tokenizer's special tokens as variables. No tokenizer is loaded: the engine
tokenizes the prompt and counts the tokens; importing ``transformers`` in every
ingress process would cost seconds and hundreds of MiB.

A model with no tokenizer folder at all (a Python model that formats its own prompts, or is not a
transformer) gets ``PlainTranscript``: one ``role: content`` line per message, then ``assistant:``.
Refusing chat there would leave such a model on ``/v1/completions`` only, while every chat client
would send it the same conversation; a transcript is what it can read without knowing any template.
A model that names a tokenizer without a template is still refused, as vLLM refuses it: there the
template is missing by mistake, and a transcript would be silently wrong for that model.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any, NoReturn, Protocol

from conveyor.ingress.openai.errors import unreadable
from conveyor.proto.errors import internal, invalid_arg
from conveyor.proto.repository_files import read_text

_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


class Renderer(Protocol):
    def prompt(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str: ...


class PlainTranscript:
    """The conversation of a model without a chat template: ``role: content`` lines."""

    def prompt(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        if tools:
            raise invalid_arg("the model has no chat template to write `tools` into: name a tokenizer folder "
                              "with one (the config's `tokenizer` parameter, docs/OPENAI.md)")
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        if add_generation_prompt:
            lines.append("assistant:")
        return "\n".join(lines)


PLAIN = PlainTranscript()


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        from jinja2 import ext, sandbox

        env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                    extensions=[ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(source)
        self._special = special_tokens

    def prompt(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        """The conversation as the model's template writes it, ready for the assistant's turn. ``tools``:
        the functions the model may call, in OpenAI's shape, as transformers passes them (None: none)."""
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         tools=tools, **self._special)
        except Exception as exc:  # raise_exception in the template, or a template error
            raise invalid_arg(f"cannot apply the model's chat template: {exc}") from None


def load_chat_template(folder: str) -> ChatTemplate:
    """Blocking (reads files): run in a thread. ``folder`` is the tokenizer's folder."""
    try:
        import jinja2  # noqa: F401
    except ImportError:
        raise internal("chat completions need the 'jinja2' package (pip install conveyor[vllm])") from None
    config = _json(os.path.join(folder, "tokenizer_config.json"))
    source: Any = None
    try:
        source = read_text(os.path.join(folder, "chat_template.jinja"))
    except FileNotFoundError:
        source = config.get("chat_template")
    if isinstance(source, list):  # named templates
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if not isinstance(source, str) or not source:
        if not os.path.isdir(folder):
            raise internal(f"the tokenizer folder '{folder}' does not exist (a Hugging Face model id is not "
                           "fetched: name a local folder in model.json)")
        raise invalid_arg("the model has no chat template: use /v1/completions")
    special = {}
    for name in _SPECIAL:
        token = config.get(name)
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str):
            special[name] = token
    try:
        return ChatTemplate(source, special)
    except Exception as exc:
        raise internal(f"the model's chat template does not compile: {exc}") from None


def _json(path: str) -> dict[str, Any]:
    try:
        doc = json.loads(read_text(path))  # never a FIFO's wait (proto/repository_files.py)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise unreadable(path, exc) from None
    return doc if isinstance(doc, dict) else {}


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> NoReturn:
    raise ValueError(message)
