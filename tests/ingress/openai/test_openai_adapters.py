"""The pure parts of runtime LoRA: the load/unload bodies checked as vLLM's server checks them, the
base model a body that names none is for, and where a repository's adapters are found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conveyor.ingress.openai.adapters import base_model, load_request, unload_request
from conveyor.ingress.openai.catalog import LlmModel
from conveyor.ingress.openai.contract import Contract
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.lora import repository_adapters
from conveyor.proto.signature import ModelSignature
from conveyor.workers.backends.vllm.lora import LoraRepository

LEVEL = "unit"


def _refused(body: bytes, parse: object = load_request) -> str:
    with pytest.raises(ConveyorError) as err:
        parse(body)  # type: ignore[operator]
    assert err.value.status is Status.INVALID_ARG
    return err.value.message


def test_bodies_are_vllms() -> None:
    req = load_request(b'{"lora_name": "a", "lora_path": "/p", "extra": 1}')  # unknown fields ignored, as pydantic
    assert (req.lora_name, req.lora_path, req.load_inplace, req.base_model_name) == ("a", "/p", False, None)
    assert load_request(b'{"lora_name": "a", "lora_path": "/p", "load_inplace": true, '
                        b'"base_model_name": "m"}').base_model_name == "m"
    assert _refused(b'{"lora_name": "", "lora_path": "/p"}') == "Both 'lora_name' and 'lora_path' must be provided."
    assert "lora_path" in _refused(b'{"lora_name": "a"}')
    assert "not valid JSON" in _refused(b"{")
    assert unload_request(b'{"lora_name": "a", "lora_int_id": 3}').lora_name == "a"
    assert _refused(b'{"lora_name": ""}', unload_request) == (
        "'lora_name' needs to be provided to unload a LoRA adapter.")


def _model(name: str, runtime: bool) -> LlmModel:
    sig = ModelSignature.from_wire({"name": name, "max_batch_size": 0, "inputs": [], "outputs": [], "decoupled": True})
    contract = Contract(decoupled=True, sampling_json=True, counts_tokens=False)
    return LlmModel(name, sig, contract, "/nowhere", {}, 0, runtime_lora=runtime)


def test_the_base_model_is_the_one_that_takes_runtime_adapters() -> None:
    assert base_model([_model("a", False), _model("b", True)]) == "b"
    with pytest.raises(ConveyorError, match="ALLOW_RUNTIME_LORA_UPDATING"):
        base_model([_model("a", False)])
    with pytest.raises(ConveyorError, match=r"several models .*\(a, b\).*base_model_name"):
        base_model([_model("b", True), _model("a", True)])


def test_a_repository_names_adapters_in_multi_lora_json_and_in_loras(tmp_path: Path) -> None:
    assert repository_adapters(str(tmp_path)) is None
    (tmp_path / "loras" / "beta").mkdir(parents=True)
    (tmp_path / "loras" / "alpha").mkdir()
    (tmp_path / "loras" / "README").write_text("not an adapter")
    assert repository_adapters(str(tmp_path)) == {"alpha": str(tmp_path / "loras" / "alpha"),
                                                  "beta": str(tmp_path / "loras" / "beta")}
    # multi_lora.json's first, in its order; the same folder under one name in both is one adapter
    (tmp_path / "multi_lora.json").write_text(json.dumps({"gamma": "/g", "beta": str(tmp_path / "loras" / "beta")}))
    assert list(repository_adapters(str(tmp_path)) or {}) == ["gamma", "beta", "alpha"]
    (tmp_path / "multi_lora.json").write_text(json.dumps({"alpha": "/elsewhere"}))
    with pytest.raises(ConveyorError, match=r"both in multi_lora\.json"):
        repository_adapters(str(tmp_path))
    (tmp_path / "multi_lora.json").write_text("[1]")
    with pytest.raises(ConveyorError, match="must map each adapter name"):
        repository_adapters(str(tmp_path))


def test_an_engine_without_repository_adapters_needs_the_runtime_gate(tmp_path: Path) -> None:
    lora = {"enable_lora": True}
    with pytest.raises(ConveyorError, match="cannot find"):
        LoraRepository.load(str(tmp_path), lora)
    repo = LoraRepository.load(str(tmp_path), lora, runtime=True)
    assert repo.enabled and repo.names == []
    assert not LoraRepository.load(str(tmp_path), {}).enabled
