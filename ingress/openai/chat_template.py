"""A model's own chat template, applied with its Hugging Face tokenizer.

``transformers`` is imported only when the first chat request arrives (it is heavy,
and completions do not need it); the tokenizer files are the model's own, read from
the path its ``model.json`` names.
"""

from __future__ import annotations

from typing import Any

from conveyor.proto.errors import internal, invalid_arg


class ChatTokenizer:
    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def prompt(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The conversation as the model's template writes it, ready for the assistant's turn."""
        if not getattr(self._tokenizer, "chat_template", None):
            raise invalid_arg("the model has no chat template: use /v1/completions")
        try:
            text = self._tokenizer.apply_chat_template(messages, tokenize=False,
                                                       add_generation_prompt=add_generation_prompt)
        except Exception as exc:  # jinja's own errors (raise_exception in a template, bad roles)
            raise invalid_arg(f"cannot apply the model's chat template: {exc}") from None
        return str(text)


def load_tokenizer(source: str, engine_args: dict[str, Any]) -> ChatTokenizer:
    """Blocking: run in a thread."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise internal("chat completions need the 'transformers' package (pip install conveyor[vllm])") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source, revision=engine_args.get("tokenizer_revision"),
            trust_remote_code=bool(engine_args.get("trust_remote_code", False)),
        )
    except Exception as exc:
        raise internal(f"cannot load the tokenizer '{source}': {exc}") from None
    return ChatTokenizer(tokenizer)
