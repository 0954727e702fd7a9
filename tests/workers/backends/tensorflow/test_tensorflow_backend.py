"""The tensorflow backend on its own: Triton's parameters, the signature it serves, its checks of a
config against the model (with Triton's messages), and a worker without TensorFlow."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from conveyor.deploy.example_repo import write_model
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.model_config import parse_text
from conveyor.router.repository.scan import load_spec
from conveyor.workers.backends import cpu_threads, load_backend
from conveyor.workers.backends.tensorflow.settings import TensorFlowSettings


def params(**values: str) -> mc.ModelConfig:
    return parse_text('name: "m" ' + "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n'
                                             for k, v in values.items()))


def test_parameters_as_triton_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_threads, "usable_cpus", lambda: 8)
    s = TensorFlowSettings.from_config(params(TF_NUM_INTRA_THREADS="2", TF_NUM_INTER_THREADS="3", TF_GRAPH_TAG="gpu",
                                              TF_SIGNATURE_DEF="predict", MAX_SESSION_SHARE_COUNT="2"))
    assert (s.intra_op_threads, s.inter_op_threads, s.graph_tag, s.signature_def) == (2, 3, "gpu", "predict")
    s = TensorFlowSettings.from_config(parse_text("instance_group [{ count: 2 kind: KIND_CPU }]"))
    assert (s.intra_op_threads, s.inter_op_threads, s.graph_tag, s.signature_def) == (4, 3, "serve", "")
    with pytest.raises(ConveyorError, match="parameter 'TF_NUM_INTRA_THREADS' must be non-negative number"):
        TensorFlowSettings.from_config(params(TF_NUM_INTRA_THREADS="-1"))
    with pytest.raises(ConveyorError, match="parameter 'MAX_SESSION_SHARE_COUNT' must be positive number"):
        TensorFlowSettings.from_config(params(MAX_SESSION_SHARE_COUNT="0"))


def test_platform_and_file_from_the_version_directory(tmp_path: Path) -> None:
    for name, entry in (("saved", "model.savedmodel"), ("frozen", "model.graphdef")):
        write_model(
            tmp_path, name,
            'backend: "tensorflow"\nmax_batch_size: 2\ninput [{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }]\n'
            'output [{ name: "y" data_type: TYPE_FP32 dims: [ 3 ] }]\n')
        (tmp_path / name / "1" / entry).mkdir()
        spec = load_spec(name, str(tmp_path / name))
        assert spec.error == "" and spec.backend == "tensorflow"
        assert spec.config.platform == ("tensorflow_savedmodel" if name == "saved" else "tensorflow_graphdef")
        assert spec.versions == {1: str(tmp_path / name / "1" / entry)}


def test_without_tensorflow_the_model_says_which_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    monkeypatch.delitem(sys.modules, "conveyor.workers.backends.tensorflow.backend", raising=False)
    with pytest.raises(ConveyorError, match=r"pip install 'conveyor\[tensorflow\]'") as exc:
        load_backend("tensorflow", str(tmp_path), parse_text('platform: "tensorflow_savedmodel"'), "cpu")
    assert exc.value.status == Status.UNAVAILABLE


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")
    from tests.support import tensorflow_models

    return str(tensorflow_models.save_savedmodel(str(tmp_path_factory.mktemp("saved"))))


def declared(extra: str = "", dims: str = "[ 4 ]", max_batch_size: int = 8) -> mc.ModelConfig:
    return parse_text(f'name: "m" platform: "tensorflow_savedmodel" max_batch_size: {max_batch_size} '
                      f'input [{{ name: "x" data_type: TYPE_FP32 dims: {dims} }},'
                      f' {{ name: "words" data_type: TYPE_STRING dims: [ 1 ] reshape: {{ shape: [ ] }} }}]'
                      f' output [{{ name: "y" data_type: TYPE_FP32 dims: [ 3 ] }}] {extra}')


@pytest.mark.parametrize(("config", "reason"), [
    (declared(dims="[ 5 ]"), "model 'm', tensor 'x': the model expects 2 dimensions (shape [-1,4]) but the model "
                             "configuration specifies 2 dimensions (an initial batch dimension because "
                             "max_batch_size > 0 followed by the explicit tensor shape, making complete shape [-1,5])"),
    (declared('input [{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }]'),
     "unexpected inference input 'z', allowed inputs are: words, x"),
    (declared('parameters { key: "TF_SIGNATURE_DEF" value { string_value: "predict" } }'),
     "unable to load model 'm', expected 'predict' signature"),
])
def test_config_checked_against_the_signature(saved: str, config: mc.ModelConfig, reason: str) -> None:
    with pytest.raises(ConveyorError) as exc:
        load_backend("tensorflow", saved, config, "cpu")
    assert reason in exc.value.message


def test_completion_without_a_default_batch_size_keeps_the_batch_dimension(saved: str) -> None:
    from conveyor.proto.model_config import to_json
    from conveyor.workers.backends.tensorflow.autocomplete import complete

    done: dict[str, Any] = complete({"config": to_json(parse_text('name: "m"')), "model_path": saved,
                                     "default_max_batch_size": 0})
    assert done["max_batch_size"] == 0  # --backend-config=tensorflow,default-max-batch-size=0: no batching
    assert {i["name"]: i["dims"] for i in done["input"]} == {"x": [-1, 4], "words": [-1]}
