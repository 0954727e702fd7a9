"""Which vLLM models label their engines' metrics: one engine keeps Triton's labels (model, version);
a model that may run several (a count over one, GPUs listed, or no instance_group: one per worker)
says which engine each series is."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from conveyor.proto import model_config_pb2 as mc
from conveyor.workers.backends.vllm.backend import several_engines

LEVEL = "unit"


@pytest.mark.parametrize(("groups", "several"), [
    ("instance_group [{ count: 1 kind: KIND_MODEL }]", False),
    ("instance_group [{ count: 2 kind: KIND_MODEL }]", True),
    ("instance_group [{ count: 1 kind: KIND_GPU gpus: [0, 1] }]", True),
    ("instance_group [{ kind: KIND_GPU gpus: [0] }]", False),
    ("", True),
])
def test_several_engines(groups: str, several: bool) -> None:
    config = text_format.Parse(f'backend: "vllm"\n{groups}', mc.ModelConfig())
    assert several_engines(config) is several
