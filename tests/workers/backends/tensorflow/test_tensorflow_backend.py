"""The tensorflow backend on its own, without TensorFlow: Triton's parameters, the platform from the
version directory, its checks of a config against a signature (with Triton's messages), config
completion from one, and a worker without TensorFlow. The e2e tests serve real models."""

from __future__ import annotations

import sys
from dataclasses import replace
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
from conveyor.workers.backends.tensorflow.signature import Signature, TensorInfo, check_config

LEVEL = "unit"


def params(**values: str) -> mc.ModelConfig:
    return parse_text('name: "m" ' + "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n'
                                             for k, v in values.items()))


def test_parameters_as_triton_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_threads, "usable_cpus", lambda: 8)
    s = TensorFlowSettings.from_config(params(TF_NUM_INTRA_THREADS="2", TF_NUM_INTER_THREADS="3", TF_GRAPH_TAG="gpu",
                                              TF_SIGNATURE_DEF="predict", MAX_SESSION_SHARE_COUNT="2"))
    assert (s.intra_op_threads, s.inter_op_threads, s.graph_tag, s.signature_def) == (2, 3, "gpu", "predict")
    assert s.session_share_count == 2
    s = TensorFlowSettings.from_config(parse_text("instance_group [{ count: 2 kind: KIND_CPU }]"))
    # Unset: each call's ops on the calling thread (CALLER_THREAD), no hand-off to a pool and back.
    assert (s.intra_op_threads, s.inter_op_threads, s.graph_tag, s.signature_def) == (4, -1, "serve", "")
    assert not s.per_session_threads
    s = TensorFlowSettings.from_config(params(TF_NUM_INTER_THREADS="-1", TF_USE_PER_SESSION_THREADS="true"))
    assert (s.inter_op_threads, s.per_session_threads) == (-1, True)
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


# The test model's signature (tests/support/tensorflow_models.py) as the backend reads it: the checks and
# completion work on it without TensorFlow (the e2e tests import it, to build and call the model).
SCORER = Signature(inputs={"x": TensorInfo(mc.TYPE_FP32, [-1, 4]), "words": TensorInfo(mc.TYPE_STRING, [-1])},
                   outputs={"y": TensorInfo(mc.TYPE_FP32, [-1, 3]), "upper": TensorInfo(mc.TYPE_STRING, [-1]),
                            "lens": TensorInfo(mc.TYPE_INT32, [-1])})


def declared(extra: str = "", dims: str = "[ 4 ]", x_type: str = "TYPE_FP32") -> mc.ModelConfig:
    return parse_text(f'name: "m" platform: "tensorflow_savedmodel" max_batch_size: 8 '
                      f'input [{{ name: "x" data_type: {x_type} dims: {dims} }},'
                      f' {{ name: "words" data_type: TYPE_STRING dims: [ 1 ] reshape: {{ shape: [ ] }} }}]'
                      f' output [{{ name: "y" data_type: TYPE_FP32 dims: [ 3 ] }}] {extra}')


@pytest.mark.parametrize(("config", "signature", "reason"), [
    (declared(dims="[ 5 ]"), SCORER,
     "model 'm', tensor 'x': the model expects 2 dimensions (shape [-1,4]) but the model configuration specifies "
     "2 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, "
     "making complete shape [-1,5])"),
    (declared('input [{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }]'), SCORER,
     "unexpected inference input 'z', allowed inputs are: words, x"),
    (parse_text('name: "m" max_batch_size: 8 input [{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }]'), SCORER,
     "unable to load model 'm', configuration expects 1 inputs, model provides 2"),
    (declared(x_type="TYPE_FP64"), SCORER,
     "unable to load model 'm', configuration expects datatype TYPE_FP64 for input 'x', model provides TYPE_FP32"),
    (declared(), replace(SCORER, inputs={**SCORER.inputs, "x": TensorInfo(mc.TYPE_FP32, [2, 4])}),
     "model 'm', tensor 'x': for the model to support batching the shape should have at least 1 dimension and the "
     "first dimension must be -1; but shape expected by the model is [2,4]"),
])
def test_config_checked_against_the_signature(config: mc.ModelConfig, signature: Signature, reason: str) -> None:
    with pytest.raises(ConveyorError) as exc:
        check_config(config, signature)
    assert reason in exc.value.message


@pytest.mark.parametrize(("default_max", "max_batch_size", "x_dims", "words_dims"), [
    (4, 4, [4], [1]),  # --backend-config=tensorflow,default-max-batch-size: 4 unless given
    (0, 0, [-1, 4], [-1]),  # default-max-batch-size=0: no batching, the batch dimension kept in the dims
])
def test_completion_from_the_signature(monkeypatch: pytest.MonkeyPatch, default_max: int, max_batch_size: int,
                                       x_dims: list[int], words_dims: list[int]) -> None:
    from conveyor.proto.model_config import to_json
    from conveyor.workers.backends.tensorflow import autocomplete

    monkeypatch.setattr(autocomplete, "import_tensorflow", lambda: None)
    monkeypatch.setattr(autocomplete, "load_savedmodel", lambda *_: SCORER)
    done: dict[str, Any] = autocomplete.complete({"config": to_json(parse_text('name: "m"')), "model_path": "m",
                                                  "default_max_batch_size": default_max})
    assert done.get("max_batch_size", 0) == max_batch_size
    assert ("dynamic_batching" in done) == (max_batch_size > 1)
    assert {i["name"]: i["dims"] for i in done["input"]} == {"x": x_dims, "words": words_dims}
    assert [o["name"] for o in done["output"]] == ["y", "upper", "lens"]
