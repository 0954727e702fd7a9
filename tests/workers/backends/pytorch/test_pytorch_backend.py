"""The TorchScript backend on its own: Triton's naming rules, parameters, types and load errors."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.model_config import parse_text
from conveyor.workers.backends import load_backend
from conveyor.workers.backends.pytorch.naming import input_positions, output_positions
from conveyor.workers.backends.pytorch.settings import TorchSettings

LEVEL = "slow"


def test_inputs_by_forward_argument_then_index_then_order() -> None:
    assert input_positions(["b", "a"], ["a", "b"]) == {"b": 1, "a": 0}
    assert input_positions(["INPUT__1", "INPUT__0"], ["x", "y"]) == {"INPUT__1": 1, "INPUT__0": 0}
    # One name that is neither: the config's order, as Triton falls back to.
    assert input_positions(["INPUT__1", "x2"], ["x", "y"]) == {"INPUT__1": 0, "x2": 1}
    assert input_positions(["A__B__0"], ["x"]) == {"A__B__0": 0}  # the index follows the first "__"


def test_outputs_by_index_then_order() -> None:
    assert output_positions(["OUTPUT__1", "OUTPUT__0"]) == {"OUTPUT__1": 1, "OUTPUT__0": 0}
    assert output_positions(["y", "z"]) == {"y": 0, "z": 1}


def test_settings_from_parameters() -> None:
    default = TorchSettings.from_config(mc.ModelConfig())
    assert default.inference_mode and default.optimized_execution and default.intra_op_threads is None
    config = parse_text('parameters [{ key: "INFERENCE_MODE" value { string_value: "false" } },'
                        '{ key: "DISABLE_OPTIMIZED_EXECUTION" value { string_value: "true" } },'
                        '{ key: "INTRA_OP_THREAD_COUNT" value { string_value: "2" } }]')
    s = TorchSettings.from_config(config)
    assert not s.inference_mode and not s.optimized_execution and s.intra_op_threads == 2
    with pytest.raises(ConveyorError, match="INFERENCE_MODE"):
        TorchSettings.from_config(parse_text('parameters { key: "INFERENCE_MODE" value { string_value: "maybe" } }'))
    # The thread counts under the names Triton's model.py runtime reads; ENABLE_NVFUSER is read and ignored.
    config = parse_text('parameters [{ key: "NUM_THREADS" value { string_value: "3" } },'
                        '{ key: "NUM_INTEROP_THREADS" value { string_value: "2" } },'
                        '{ key: "ENABLE_NVFUSER" value { string_value: "true" } },'
                        '{ key: "ENABLE_WEIGHT_SHARING" value { string_value: "true" } }]')
    s = TorchSettings.from_config(config)
    assert (s.intra_op_threads, s.inter_op_threads, s.weight_sharing) == (3, 2, True)
    with pytest.raises(ConveyorError, match="'INTRA_OP_THREAD_COUNT' \\(2\\) and 'NUM_THREADS' \\(3\\)"):
        TorchSettings.from_config(parse_text('parameters [{ key: "NUM_THREADS" value { string_value: "3" } },'
                                             '{ key: "INTRA_OP_THREAD_COUNT" value { string_value: "2" } }]'))
    with pytest.raises(ConveyorError, match="ENABLE_NVFUSER"):
        TorchSettings.from_config(parse_text('parameters { key: "ENABLE_NVFUSER" value { string_value: "y" } }'))


def test_without_torch_the_model_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails as if it were not installed
    monkeypatch.delitem(sys.modules, "conveyor.workers.backends.pytorch.backend", raising=False)
    with pytest.raises(ConveyorError, match="PyTorch is not installed") as info:
        load_backend("pytorch", str(tmp_path / "model.pt"), mc.ModelConfig(), "cpu")
    assert info.value.status == Status.UNAVAILABLE


# --- with torch -------------------------------------------------------------------------------

def _load(tmp_path: Path, module: object, config: str) -> Any:
    from tests.support import torch_models

    path = torch_models.save(module, str(tmp_path), "m", config)
    return load_backend("pytorch", path, parse_text(config), "cpu")


def test_add_sub_by_index_names(tmp_path: Path, torch_models: Any) -> None:
    import torch

    backend = _load(tmp_path, torch.jit.script(torch_models.AddSub()), torch_models.ADD_SUB_CONFIG.format(
        name="m", extra=""))
    a, b = np.arange(16, dtype=np.float32), np.ones(16, dtype=np.float32)
    out = backend.execute({"INPUT__1": b, "INPUT__0": a}, ["OUTPUT__1", "OUTPUT__0"])
    np.testing.assert_array_equal(out["OUTPUT__0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT__1"], a - b)
    assert isinstance(out["OUTPUT__0"], np.ndarray)


def test_forward_argument_names_and_read_only_inputs(tmp_path: Path, torch_models: Any) -> None:
    import torch

    backend = _load(tmp_path, torch.jit.script(torch_models.Scale()), torch_models.SCALE_CONFIG)
    image = np.arange(5, dtype=np.float32)
    image.setflags(write=False)  # as a client segment mapped read-only is
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on non-writable arrays: the backend must not hand it one
        out = backend.execute({"image": image, "factor": np.array([3], dtype=np.float32)},
                              ["OUTPUT__0"])
    np.testing.assert_array_equal(out["OUTPUT__0"], image * 3)


def test_dict_input_and_strings(tmp_path: Path, torch_models: Any) -> None:
    import torch

    config = ('platform: "pytorch_libtorch" input [{ name: "A" data_type: TYPE_INT64 dims: [2] },'
              '{ name: "B" data_type: TYPE_INT64 dims: [2] }] output [{ name: "S" data_type: TYPE_INT64 dims: [2] }]')
    backend = _load(tmp_path, torch.jit.script(torch_models.DictSum()), config)
    a, b = np.array([1, 2]), np.array([3, 4])
    np.testing.assert_array_equal(backend.execute({"A": a, "B": b}, ["S"])["S"], a + 10 * b)
    strings = _load(tmp_path / "s", torch.jit.script(torch_models.Upper()), torch_models.UPPER_CONFIG)
    out = strings.execute({"INPUT__0": np.array([b"ab", "é".encode()], dtype=object)}, ["OUTPUT__0"])
    assert out["OUTPUT__0"].tolist() == [b"AB", "é".encode()]  # UTF-8 both ways (upper() is ASCII-only)


def test_bf16_travels_as_raw_words(tmp_path: Path, torch_models: Any) -> None:
    import torch

    config = torch_models.ADD_SUB_CONFIG.format(name="m", extra="").replace("TYPE_FP32", "TYPE_BF16")
    backend = _load(tmp_path, torch.jit.script(torch_models.AddSub()), config)
    a = torch.tensor([1.5] * 16, dtype=torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    out = backend.execute({"INPUT__0": a, "INPUT__1": a}, ["OUTPUT__0"])
    got = torch.from_numpy(out["OUTPUT__0"].view(np.int16)).view(torch.bfloat16)
    assert got.tolist() == [3.0] * 16


def test_load_errors_say_why(tmp_path: Path, torch_models: Any) -> None:
    import torch

    script = torch.jit.script(torch_models.AddSub())
    base = torch_models.ADD_SUB_CONFIG.format(name="m", extra="")
    cases = {
        base.replace("TYPE_FP32", "TYPE_UINT32"): "unsupported datatype TYPE_UINT32 for input 'INPUT__0'",
        base.replace(',\n  { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 16 ] }', ""):
            "configuration expects 1 inputs, model provides 2",
        base.replace("INPUT__1", "INPUT__5"): "do not map one to one",
        'platform: "pytorch_libtorch"': "model configuration must contain at least one output",
        torch_models.UPPER_CONFIG.replace("dims: [ -1 ] } ]\noutput", "dims: [ 2, 2 ] } ]\noutput"):
            "1-dimensional List",
    }
    for i, (config, match) in enumerate(cases.items()):
        path = torch_models.save(script, str(tmp_path / str(i)), "m", config)
        with pytest.raises(ConveyorError, match=match) as info:
            load_backend("pytorch", path, parse_text(config), "cpu")
        assert info.value.status == Status.UNAVAILABLE


def test_gpu_instance_without_cuda_says_why(tmp_path: Path, torch_models: Any) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a CUDA GPU")
    config = torch_models.ADD_SUB_CONFIG.format(name="m", extra="")
    path = torch_models.save(torch.jit.script(torch_models.AddSub()), str(tmp_path), "m", config)
    with pytest.raises(ConveyorError, match="sees no CUDA device"):
        load_backend("pytorch", path, parse_text(config), "cuda:0")


def test_wrong_output_type_fails_the_batch(tmp_path: Path, torch_models: Any) -> None:
    import torch

    config = torch_models.ADD_SUB_CONFIG.format(name="m", extra="").replace(
        '"OUTPUT__1" data_type: TYPE_FP32', '"OUTPUT__1" data_type: TYPE_INT32')
    backend = _load(tmp_path, torch.jit.script(torch_models.AddSub()), config)
    x = np.zeros(16, dtype=np.float32)
    with pytest.raises(ConveyorError, match="expects datatype TYPE_INT32 for output 'OUTPUT__1'"):
        backend.execute({"INPUT__0": x, "INPUT__1": x}, ["OUTPUT__1"])


def test_parameters_apply(tmp_path: Path, torch_models: Any) -> None:
    import torch

    extra = ('parameters [{ key: "INFERENCE_MODE" value { string_value: "false" } },'
             '{ key: "DISABLE_OPTIMIZED_EXECUTION" value { string_value: "true" } }]')
    backend = _load(tmp_path, torch.jit.script(torch_models.AddSub()),
                    torch_models.ADD_SUB_CONFIG.format(name="m", extra=extra))
    assert torch.get_num_threads() == 1  # one intra-op thread unless INTRA_OP_THREAD_COUNT says otherwise
    x = np.ones(16, dtype=np.float32)
    np.testing.assert_array_equal(backend.execute({"INPUT__0": x, "INPUT__1": x}, ["OUTPUT__0"])["OUTPUT__0"],
                                  2 * x)


def test_num_threads_sets_torch_intra_op_threads(tmp_path: Path, torch_models: Any) -> None:
    import torch

    extra = 'parameters { key: "NUM_THREADS" value { string_value: "2" } }'
    script = torch.jit.script(torch_models.AddSub())
    _load(tmp_path, script, torch_models.ADD_SUB_CONFIG.format(name="m", extra=extra))
    assert torch.get_num_threads() == 2
    _load(tmp_path / "b", script, torch_models.ADD_SUB_CONFIG.format(name="m", extra=""))
    assert torch.get_num_threads() == 1


@pytest.fixture()
def torch_switches() -> Any:
    """Put torch's process-wide switches back as they were."""
    import torch

    saved = (torch._C._jit_texpr_fuser_enabled(), torch.backends.cudnn.enabled)
    yield
    torch._C._jit_set_texpr_fuser_enabled(saved[0])
    torch.backends.cudnn.enabled = saved[1]


def test_each_call_runs_under_its_own_models_switches(tmp_path: Path, torch_models: Any, torch_switches: Any) -> None:
    import torch

    off = ('parameters [{ key: "ENABLE_TENSOR_FUSER" value { string_value: "false" } },'
           '{ key: "DISABLE_CUDNN" value { string_value: "true" } }]')
    on = 'parameters { key: "ENABLE_TENSOR_FUSER" value { string_value: "true" } }'
    script = torch.jit.script(torch_models.AddSub())
    a = _load(tmp_path / "a", script, torch_models.ADD_SUB_CONFIG.format(name="m", extra=off))
    b = _load(tmp_path / "b", script, torch_models.ADD_SUB_CONFIG.format(name="m", extra=on))
    x = {"INPUT__0": np.ones(16, dtype=np.float32), "INPUT__1": np.ones(16, dtype=np.float32)}
    a.execute(x, ["OUTPUT__0"])  # loaded first, yet its switches hold for its calls (as in Triton)
    assert not torch._C._jit_texpr_fuser_enabled() and not torch.backends.cudnn.enabled
    b.execute(x, ["OUTPUT__0"])
    assert torch._C._jit_texpr_fuser_enabled() and torch.backends.cudnn.enabled


def test_weight_sharing_loads_a_model_once_per_device(tmp_path: Path, torch_models: Any) -> None:
    import torch

    from conveyor.workers.backends.pytorch.sharing import SHARED

    sharing = 'parameters { key: "ENABLE_WEIGHT_SHARING" value { string_value: "true" } }'
    text = torch_models.MLP_CONFIG.format(name="m", extra=sharing)
    path = torch_models.save(torch.jit.script(torch_models.Mlp()), str(tmp_path), "m", text)
    config = parse_text(text)
    first, second = (load_backend("pytorch", path, config, "cpu") for _ in range(2))
    assert first.module is second.module and len(SHARED) == 1  # type: ignore[union-attr]
    alone = load_backend("pytorch", path, parse_text(torch_models.MLP_CONFIG.format(name="m", extra="")), "cpu")
    assert alone.module is not first.module  # type: ignore[union-attr]
    x = np.ones((2, 4), dtype=np.float32)
    np.testing.assert_array_equal(first.execute({"INPUT__0": x}, ["OUTPUT__0"])["OUTPUT__0"],  # type: ignore[union-attr]
                                  alone.execute({"INPUT__0": x}, ["OUTPUT__0"])["OUTPUT__0"])  # type: ignore[union-attr]
    first.close()
    assert len(SHARED) == 1  # the second instance still uses it
    second.close()
    assert len(SHARED) == 0


def test_sequence_controls_are_forward_arguments(tmp_path: Path, torch_models: Any) -> None:
    """Triton's QA sequence models (gen_qa_sequence_models.py --libtorch) take their controls as arguments
    (INPUT__0, START__1, READY__2): the sequence batcher's control tensors count as the model's inputs."""
    import torch

    config = """max_batch_size: 0
input [{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 1 ] }]
output [{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 1 ] }]
sequence_batching { control_input [{ name: "START__1"
  control [{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }] }] }
"""
    backend = _load(tmp_path, torch.jit.script(torch_models.AddSub()), config)
    out = backend.execute({"INPUT__0": np.array([2], np.float32), "START__1": np.array([1], np.float32)},
                          ["OUTPUT__0", "OUTPUT__1"])
    assert out["OUTPUT__0"].tolist() == [3.0] and out["OUTPUT__1"].tolist() == [1.0]
