"""Where a model's tokenizer lives, and the tokenizer itself for ``/tokenize``, ``/detokenize`` and
the ``usage`` of models that do not count their own tokens.

The tokenizer folder (Hugging Face files: ``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja``) is, first found:

1. the config's ``tokenizer`` parameter, or ``tokenizer_dir`` (the name TensorRT-LLM's Triton models
   use): a parameter because a Python model has no ``model.json``, and Triton ignores a parameter it
   does not know (the Python backend hands it to the model), so the repository still serves there;
2. ``model.json``'s ``tokenizer``, else its ``model`` (the vLLM backend's engine arguments);
3. the version directory itself, when it holds one of those files beside ``model.py``.

A relative path is looked up in the version directory, then in the model's directory. None of these:
``--tokenizer``'s folder (Triton's OpenAI frontend's flag: its one tokenizer) if given, else the model has
no tokenizer (chat then writes a plain transcript, ``chat_template.py``).

Only the ``tokenizers`` library is loaded, from ``tokenizer.json`` (a "fast" tokenizer), on first use
and in a thread: ``transformers`` would cost every ingress process seconds and hundreds of MiB. A
folder without ``tokenizer.json`` (a slow, SentencePiece-only tokenizer) still gives its chat template.
"""

from __future__ import annotations

import json
import os
from typing import Any

from conveyor.ingress.openai.errors import unreadable
from conveyor.proto.errors import internal
from conveyor.proto.repository_files import check_regular, read_text

PARAMETERS = ("tokenizer", "tokenizer_dir")
_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def tokenizer_folder(version_dir: str, engine_args: dict[str, Any], parameters: dict[str, str]) -> str | None:
    """The model's tokenizer folder (see the module's docstring), or None. A name that is neither a
    local folder nor relative to the model (a Hugging Face id) is returned as it is: reading it fails
    with a message that says so."""
    named = next((parameters[k] for k in PARAMETERS if parameters.get(k)), "")
    if not named:
        named = str(engine_args.get("tokenizer") or engine_args.get("model") or "")
    if named:
        if os.path.isabs(named):
            return named
        for base in (version_dir, os.path.dirname(version_dir.rstrip(os.sep))):
            local = os.path.join(base, named)
            if os.path.exists(local):
                return local
        return named
    if any(os.path.exists(os.path.join(version_dir, f)) for f in _FILES):
        return version_dir
    return None


class Tokenizer:
    """A Hugging Face fast tokenizer (``tokenizers.Tokenizer``) and the model's context length."""

    def __init__(self, backend: Any, max_model_len: int | None) -> None:
        self._backend = backend
        self.max_model_len = max_model_len

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def count(self, text: str, add_special_tokens: bool = False) -> int:
        return len(self._backend.encode(text, add_special_tokens=add_special_tokens).ids) if text else 0

    def token_strs(self, ids: list[int]) -> list[str]:
        return [self._backend.id_to_token(i) or "" for i in ids]

    def decode(self, ids: list[int]) -> str:
        return str(self._backend.decode(ids, skip_special_tokens=False))

    @property
    def vocab_size(self) -> int:
        return int(self._backend.get_vocab_size(with_added_tokens=True))


def load_tokenizer(folder: str, engine_args: dict[str, Any]) -> Tokenizer | None:
    """Blocking (reads files): run in a thread. None when ``folder`` has no ``tokenizer.json``."""
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.exists(path):
        return None
    try:
        from tokenizers import Tokenizer as Backend
    except ImportError:
        raise internal("tokenizing needs the 'tokenizers' package (pip install conveyor[vllm])") from None
    try:
        check_regular(path)  # the tokenizers library opens it by name: never a FIFO (proto/repository_files.py)
        backend = Backend.from_file(path)
    except Exception as exc:
        raise unreadable(path, exc) from None
    return Tokenizer(backend, _max_model_len(folder, engine_args))


def _max_model_len(folder: str, engine_args: dict[str, Any]) -> int | None:
    """As vLLM reports it: the engine's ``max_model_len``, else the model config's
    ``max_position_embeddings``, else the tokenizer's ``model_max_length`` when it is a real one
    (transformers writes 1e30 for "no limit")."""
    for value in (engine_args.get("max_model_len"),
                  _json(os.path.join(folder, "config.json")).get("max_position_embeddings"),
                  _json(os.path.join(folder, "tokenizer_config.json")).get("model_max_length")):
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1 << 40:
            return int(value)
    return None


def _json(path: str) -> dict[str, Any]:
    try:
        doc = json.loads(read_text(path))  # never a FIFO's wait (proto/repository_files.py)
    except (OSError, ValueError):
        return {}  # a count of tokens is not worth refusing the model for
    return doc if isinstance(doc, dict) else {}
