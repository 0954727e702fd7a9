"""The openvino backend on its own: Triton's parameters, the checks of a config against the model
(with Triton's messages), config completion, and a worker without OpenVINO."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.model_config import parse_text, to_json
from conveyor.workers.backends import cpu_threads, load_backend
from conveyor.workers.backends.openvino.settings import OpenVinoSettings

LEVEL = "slow"


def params(**values: str) -> mc.ModelConfig:
    return parse_text("".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n'
                              for k, v in values.items()))


def test_parameters_as_triton_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_threads, "usable_cpus", lambda: 12)
    s = OpenVinoSettings.from_config(params(NUM_STREAMS="auto", PERFORMANCE_HINT="throughput", HINT_BF16="yes",
                                            COMPILATION_NUM_THREADS="2", RESHAPE_IO_LAYERS="Yes",
                                            SKIP_OV_DYNAMIC_BATCHSIZE="true", TARGET_DEVICE="cpu",
                                            CACHE_DIR="/tmp/ov-cache"))
    assert s.properties == {"NUM_STREAMS": "AUTO", "PERFORMANCE_HINT": "THROUGHPUT",
                            "INFERENCE_PRECISION_HINT": "bf16", "COMPILATION_NUM_THREADS": "2",
                            "INFERENCE_NUM_THREADS": "1"}
    # Only "yes" turns a switch on, as in Triton ("true" does not).
    assert s.reshape_io and not s.skip_dynamic_batch and s.device == "CPU" and s.cache_dir == "/tmp/ov-cache"
    # Threads: as given, else the usable cores shared among the config's CPU instances.
    assert OpenVinoSettings.from_config(params(INFERENCE_NUM_THREADS="3")).properties["INFERENCE_NUM_THREADS"] == "3"
    # Conveyor's INFERENCE_PRECISION_HINT: OpenVINO's property (HINT_BF16 can only ask for bf16).
    precise = OpenVinoSettings.from_config(params(INFERENCE_PRECISION_HINT="F32", INFERENCE_NUM_THREADS="1"))
    assert precise.properties == {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": "1"}
    four = parse_text('instance_group [{ count: 4 kind: KIND_CPU }]')
    assert OpenVinoSettings.from_config(four).properties == {"INFERENCE_NUM_THREADS": "3"}


@pytest.mark.parametrize(("values", "reason"), [
    ({"NUM_STREAMS": "many"}, "expected the parameter 'NUM_STREAMS' to be either AUTO/NUMA/<int_value>, got many"),
    ({"PERFORMANCE_HINT": "fast"}, "to be LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got fast"),
    ({"INFERENCE_NUM_THREADS": "-1"}, "expected the parameter 'INFERENCE_NUM_THREADS' to be a non-negative number"),
    ({"HINT_BF16": "no"}, "expected the parameter 'HINT_BF16' to be YES, got no"),
    ({"INFERENCE_PRECISION_HINT": "fp8"}, "'INFERENCE_PRECISION_HINT' to be one of f32/bf16/f16, got fp8"),
    ({"HINT_BF16": "yes", "INFERENCE_PRECISION_HINT": "f32"}, "'HINT_BF16' and 'INFERENCE_PRECISION_HINT' disagree"),
])
def test_bad_values_fail_with_tritons_message(values: dict[str, str], reason: str) -> None:
    with pytest.raises(ConveyorError) as exc:
        OpenVinoSettings.from_config(params(**values))
    assert reason in exc.value.message and exc.value.status == Status.INVALID_ARG


def test_without_openvino_the_model_says_which_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)
    monkeypatch.delitem(sys.modules, "conveyor.workers.backends.openvino.backend", raising=False)
    (tmp_path / "model.xml").write_text("<net/>")
    with pytest.raises(ConveyorError, match=r"pip install 'conveyor\[openvino\]'") as exc:
        load_backend("openvino", str(tmp_path / "model.xml"), parse_text('backend: "openvino"'), "cpu")
    assert exc.value.status == Status.UNAVAILABLE
    from conveyor.workers.backends.openvino.autocomplete import complete

    with pytest.raises(ConveyorError, match=r"pip install 'conveyor\[openvino\]'"):
        complete({"config": to_json(parse_text('backend: "openvino"')), "model_path": str(tmp_path / "model.xml")})


@pytest.fixture()
def ovm() -> Any:
    pytest.importorskip("openvino", reason="the openvino extra is not installed (pip install 'conveyor[openvino]')")
    from tests.support import openvino_models

    return openvino_models


def mlp_config(text: str) -> mc.ModelConfig:
    return parse_text('name: "m" backend: "openvino" ' + text)


@pytest.mark.parametrize(("config", "reason"), [
    ('max_batch_size: 8 input [{ name: "X" data_type: TYPE_FP32 dims: [5] }] '
     'output [{ name: "Y" data_type: TYPE_FP32 dims: [3] }]',
     "model 'm', tensor 'X': the model expects 2 dimensions (shape [-1,4]) but the model configuration specifies "
     "2 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, "
     "making complete shape [8,5])"),
    ('input [{ name: "X" data_type: TYPE_FP32 dims: [-1, 4] }, { name: "Z" data_type: TYPE_FP32 dims: [1] }] '
     'output [{ name: "Y" data_type: TYPE_FP32 dims: [-1, 3] }]',
     "unable to load model 'm', configuration expects 2 inputs, model provides 1"),
    ('input [{ name: "X" data_type: TYPE_STRING dims: [-1, 4] }] '
     'output [{ name: "Y" data_type: TYPE_FP32 dims: [-1, 3] }]',
     "unsupported datatype TYPE_STRING for input 'X' for model 'm'"),
    ('input [{ name: "X" data_type: TYPE_FP32 dims: [-1, 4] }] output [{ name: "out" data_type: TYPE_FP32 dims: [3] }]',
     "unexpected inference output 'out', allowed outputs are: Y"),
])
def test_config_checked_against_the_model(ovm: Any, tmp_path: Path, config: str, reason: str) -> None:
    path = ovm.save_ir(ovm.mlp(), str(tmp_path))
    with pytest.raises(ConveyorError) as exc:
        load_backend("openvino", path, mlp_config(config), "cpu")
    assert reason in exc.value.message


def test_gpu_instances_are_refused_as_triton_does(ovm: Any, tmp_path: Path) -> None:
    path = ovm.save_ir(ovm.mlp(), str(tmp_path))
    with pytest.raises(ConveyorError, match="Triton OpenVINO backend supports only Kind CPU and AUTO"):
        load_backend("openvino", path, mlp_config(""), "cuda:0")


def test_completion_without_batch_layout_keeps_the_whole_shape(ovm: Any, tmp_path: Path) -> None:
    from conveyor.workers.backends.openvino.autocomplete import complete

    path = ovm.save_ir(ovm.mlp(), str(tmp_path))  # no layout: Triton does not batch it
    done = complete({"config": to_json(parse_text('backend: "openvino"')), "model_path": path,
                     "default_max_batch_size": 4})
    assert done["max_batch_size"] == 0 and "dynamic_batching" not in done
    assert [(i["name"], i["dims"]) for i in done["input"]] == [("X", [-1, 4])]
    # With max_batch_size given (and batch layouts), the dims start after the batch dimension.
    path = ovm.save_ir(ovm.mlp(), str(tmp_path / "nc"), layout="NC")
    done = complete({"config": to_json(parse_text('backend: "openvino" max_batch_size: 16')), "model_path": path})
    assert done["max_batch_size"] == 16 and "dynamic_batching" in done
    assert [(o["name"], o["data_type"], o["dims"]) for o in done["output"]] == [("Y", "TYPE_FP32", [3])]


def test_outputs_with_a_fixed_batch_run_with_the_static_batch(ovm: Any, tmp_path: Path) -> None:
    """Triton's QA models (gen_qa_models.py --openvino) reshape their sums to a constant [8, 16]: with a
    dynamic batch OpenVINO would read 8 rows of a 1-row input. Such a model gets Triton's static batch:
    a smaller batch padded with ENABLE_BATCH_PADDING (L0_lifecycle sets it), else Triton's refusal."""
    import numpy as np
    import openvino as ov

    x, y = ov.opset1.parameter([8, 16], ov.Type.f32, "INPUT0"), ov.opset1.parameter([8, 16], ov.Type.f32, "INPUT1")
    total = ov.opset1.reshape(ov.opset1.add(x, y), [8, 16], special_zero=False)
    model = ov.Model([ov.opset1.convert(total, destination_type="f32", name="OUTPUT0")], [x, y], "m")
    for port, name in ((x.output(0), "INPUT0"), (y.output(0), "INPUT1"), (model.outputs[0], "OUTPUT0")):
        port.get_tensor().set_names({name})
    path = str(tmp_path / "model.xml")
    ov.save_model(model, path)
    config = ('max_batch_size: 8 input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [16] }, '
              '{ name: "INPUT1" data_type: TYPE_FP32 dims: [16] }] '
              'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [16] }] ')
    one = {"INPUT0": np.arange(16, dtype=np.float32).reshape(1, 16), "INPUT1": np.ones((1, 16), np.float32)}
    padded: Any = load_backend("openvino", path, mlp_config(
        config + 'parameters { key: "ENABLE_BATCH_PADDING" value { string_value: "YES" } }'), "cpu")
    assert padded.execute(dict(one), ["OUTPUT0"])["OUTPUT0"].tolist() == [list(range(1, 17))]
    unpadded: Any = load_backend("openvino", path, mlp_config(config), "cpu")
    with pytest.raises(ConveyorError, match="expected requests with batch size '8', got '1'"):
        unpadded.execute(dict(one), ["OUTPUT0"])
