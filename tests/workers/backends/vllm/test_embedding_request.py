"""An embedding request as the vLLM backend reads it (``workers/backends/vllm/embedding.py``):
Triton's ``embedding_request`` JSON, ``dimensions`` as Triton's frontend sends it or plain, and
the refusals of what the engine could not take. With the engine: tests/ingress/openai/test_openai_vllm_e2e.py."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from conveyor.proto.errors import ConveyorError, Status
from conveyor.workers.backends.base import RequestItem
from conveyor.workers.backends.vllm.embedding import EMBEDDING_INPUT, EmbedArgs, parse, task_refused

LEVEL = "unit"


def _item(doc: object, **flags: bool) -> RequestItem:
    raw = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    inputs = {"text_input": np.array([b""], dtype=object), EMBEDDING_INPUT: np.array([raw], dtype=object)}
    inputs.update({name: np.array([value]) for name, value in flags.items()})
    return RequestItem("r", inputs, [], {})


def test_tritons_embedding_request_is_read() -> None:
    assert parse(_item({"input": "hello", "pooling_params": {}})) == EmbedArgs("hello", None, None, frozenset())
    args = parse(_item({"input": [1, 2], "pooling_params": {"dimensions": [8], "use_activation": False}},
                       return_num_input_tokens=True, return_num_output_tokens=False))
    assert args == EmbedArgs([1, 2], 8, False, frozenset({"return_num_input_tokens"}))
    assert parse(_item({"input": "a", "pooling_params": {"dimensions": 4}})).dimensions == 4
    assert parse(_item({"input": "a"})).dimensions is None


@pytest.mark.parametrize("doc", [
    b"{", ["a"], {"prompt": "a"}, {"input": []}, {"input": [1, "a"]}, {"input": 3},
    {"input": "a", "pooling_params": []}, {"input": "a", "pooling_params": {"dimensions": "8"}},
    {"input": "a", "pooling_params": {"use_activation": 1}}])
def test_a_malformed_request_is_invalid(doc: object) -> None:
    with pytest.raises(ConveyorError) as err:
        parse(_item(doc))
    assert err.value.status is Status.INVALID_ARG


def test_a_task_the_engine_does_not_serve_is_refused_in_tritons_words() -> None:
    error = task_refused("m", "embed")
    assert (error.status, error.message) == (Status.UNSUPPORTED, "Model m does not support 'embed' request")
