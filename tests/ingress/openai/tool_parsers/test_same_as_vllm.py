"""The tool-call parsers against vLLM 0.32's own, on the same texts (cases.py): the same content, the same
calls, the arguments byte for byte. Slow: vLLM's import takes seconds (and runs ldconfig)."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.ingress.openai.tool_parsers import PARSERS
from conveyor.ingress.openai.tool_parsers.base import read_whole
from tests.ingress.openai.tool_parsers.cases import (
    CALLS,
    CONTENT,
    GRANITE_NO_ARRAY,
    MISTRAL_CALLS,
    MISTRAL_CONTENT,
    PYTHONIC_CALLS,
    PYTHONIC_CONTENT,
    check_id,
)

LEVEL = "slow"

TEXTS = ([("pythonic", t) for t in PYTHONIC_CALLS + PYTHONIC_CONTENT]
         + [("mistral", t) for t in MISTRAL_CALLS + MISTRAL_CONTENT]
         + [(c[0], c[1]) for c in CALLS] + CONTENT + [("granite", GRANITE_NO_ARRAY)])


class _Vocab:
    """The little a vLLM parser asks of a tokenizer: its vocabulary ([ARGS] in it: a v11 Mistral one; Jamba's
    needs its two tags there)."""

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


_ARRAY_TAGS = {"<|tool_call|>": 5, "<tool_calls>": 6, "</tool_calls>": 7}


def _vllm(parser: str, text: str) -> tuple[str | None, list[tuple[str, str]], list[str]]:
    vllm_parser: Any
    if parser == "pythonic":
        from vllm.tool_parsers.pythonic_tool_parser import PythonicToolParser
        vllm_parser = PythonicToolParser(_Vocab({}))
    elif parser == "mistral":
        from vllm.tool_parsers.mistral_tool_parser import MistralToolParser
        legacy = text.split("[TOOL_CALLS]", 1)[-1].lstrip()[:1] in ("[", "{")
        vocab = {"[TOOL_CALLS]": 5} if legacy else {"[TOOL_CALLS]": 5, "[ARGS]": 6}
        vllm_parser = MistralToolParser(_Vocab(vocab))
    elif parser == "granite":
        from vllm.tool_parsers.granite_engine_tool_parser import GraniteEngineToolParser
        vllm_parser = GraniteEngineToolParser(_Vocab(_ARRAY_TAGS))
    elif parser == "jamba":
        from vllm.tool_parsers.jamba_tool_parser import JambaToolParser
        vllm_parser = JambaToolParser(_Vocab(_ARRAY_TAGS))
    else:
        from vllm.tool_parsers.xlam_tool_parser import xLAMToolParser
        vllm_parser = xLAMToolParser(_Vocab(_ARRAY_TAGS))
    got = vllm_parser.extract_tool_calls(text, None)
    return (got.content, [(c.function.name, c.function.arguments) for c in got.tool_calls],
            [c.id for c in got.tool_calls])


@pytest.mark.parametrize(("parser", "text"), TEXTS)
def test_same_as_vllm(parser: str, text: str) -> None:
    pytest.importorskip("vllm")
    content, calls, ids = _vllm(parser, text)
    ours = read_whole(PARSERS[parser](), text, "auto")
    assert ours.content == content
    assert [(c.name, c.arguments) for c in ours.calls] == calls  # the same bytes
    for id_ in ids:
        check_id(parser, id_)
