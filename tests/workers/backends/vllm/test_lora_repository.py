"""A vLLM model's LoRA adapters (workers/backends/vllm/lora.py): runtime adapters beside the repository's, their
engine ids, and what loading, checking and removing them says. Slow: vLLM's import takes seconds (and runs
ldconfig)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.proto.errors import ConveyorError
from conveyor.workers.backends.vllm.lora import LoraRepository

LEVEL = "slow"


def test_runtime_adapters_beside_the_repositorys(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    (tmp_path / "loras" / "alpha").mkdir(parents=True)
    repo = LoraRepository.load(str(tmp_path), {"enable_lora": "true"})
    assert repo.request("alpha").lora_int_id == 1 and repo.request("alpha").lora_name == "alpha"
    first = repo.add("delta", "/d")
    assert (first.lora_name, first.lora_int_id, first.lora_path) == ("delta", 2, "/d")
    repo.check("delta")
    again = repo.add("delta", "/d2")  # in place: a new engine id, so no weights cached for the old path serve it
    assert again.lora_int_id == 3 and repo.request("delta") is again
    with pytest.raises(ConveyorError, match="already been loaded"):
        repo.add("alpha", "/x")
    assert repo.remove("alpha") is None  # a repository adapter stays
    assert repo.remove("delta") == 3 and repo.remove("delta") is None
    with pytest.raises(ConveyorError, match="LoRA delta is not supported"):
        repo.check("delta")
