"""The onnxruntime backend on the real onnxruntime (CPU): Triton's session and run
options from the config, accelerator errors at load, and models whose weights are
external data (``model.onnx`` as a directory, or weights beside the file)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.model_config import parse_text
from conveyor.workers.backends.onnxruntime.backend import OnnxRuntimeBackend
from conveyor.workers.backends.onnxruntime.settings import SHRINKAGE, run_options, session_options
from tests.support import external_data_models as ext

LEVEL = "unit"

Level = ort.GraphOptimizationLevel


def params(**values: str) -> str:
    return "".join(f'parameters {{ key: "{k.replace("__", ".")}" value: {{ string_value: "{v}" }} }}\n'
                   for k, v in values.items())


def test_default_session_options() -> None:
    opts = session_options(parse_text(""))
    assert opts.intra_op_num_threads == 1  # Conveyor: one thread per worker process
    assert opts.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert opts.graph_optimization_level == Level.ORT_ENABLE_ALL
    assert opts.enable_cpu_mem_arena and opts.enable_mem_pattern
    assert run_options(parse_text(""), "cpu") is None


@pytest.mark.parametrize(("level", "expected"), [(-1, Level.ORT_ENABLE_BASIC), (1, Level.ORT_ENABLE_EXTENDED),
                                                 (2, Level.ORT_DISABLE_ALL), (3, Level.ORT_ENABLE_ALL)])
def test_graph_levels_as_triton(level: int, expected: ort.GraphOptimizationLevel) -> None:
    opts = session_options(parse_text(f"optimization {{ graph {{ level: {level} }} }}"))
    assert opts.graph_optimization_level == expected


def test_triton_parameters_reach_the_session_options() -> None:
    opts = session_options(parse_text(params(
        intra_op_thread_count="2", inter_op_thread_count="3", execution_mode="1", enable_mem_arena="0",
        enable_mem_pattern="false", session__use_device_allocator_for_initializers="1")))
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (2, 3)
    assert opts.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert not opts.enable_cpu_mem_arena and not opts.enable_mem_pattern
    assert opts.get_session_config_entry("session.use_device_allocator_for_initializers") == "1"


def test_execution_mode() -> None:
    def mode(**values: str) -> ort.ExecutionMode:
        return session_options(parse_text(params(**values))).execution_mode

    assert mode(execution_mode="0") == ort.ExecutionMode.ORT_SEQUENTIAL
    # Conveyor: an inter-op thread count alone means parallel (Triton would ignore it).
    assert mode(inter_op_thread_count="2") == ort.ExecutionMode.ORT_PARALLEL
    assert mode(inter_op_thread_count="2", execution_mode="0") == ort.ExecutionMode.ORT_SEQUENTIAL


def test_memory_arena_shrinkage_is_a_run_option() -> None:
    opts = run_options(parse_text(params(memory__enable_memory_arena_shrinkage="cpu:0;gpu:1")), "cuda:1")
    assert opts is not None and opts.get_run_config_entry(SHRINKAGE) == "cpu:0;gpu:1"


@pytest.mark.parametrize(("values", "device", "arena"), [
    ({"memory__enable_memory_arena_shrinkage": "gpu:0"}, "cpu", "gpu:0"),
    ({"memory__enable_memory_arena_shrinkage": "cpu:0;gpu:0"}, "cuda:1", "gpu:0"),
    ({"memory__enable_memory_arena_shrinkage": "cpu:0", "enable_mem_arena": "0"}, "cpu", "cpu:0"),
])
def test_shrinking_an_arena_the_instance_lacks_is_refused_at_load(values: dict[str, str], device: str,
                                                                  arena: str) -> None:
    # ORT would fail every request instead ("Did not find an arena based allocator ...").
    with pytest.raises(ConveyorError) as err:
        run_options(parse_text(params(**values)), device)
    assert err.value.status is Status.INVALID_ARG and f"names arena '{arena}'" in err.value.message


@pytest.mark.parametrize(("values", "words"), [
    ({"execution_mode": "2"}, "'execution_mode' must be 0 (sequential) or 1 (parallel), not '2'"),
    ({"intra_op_thread_count": "many"}, "'intra_op_thread_count' must be a non-negative integer"),
    ({"enable_mem_arena": "maybe"}, "'enable_mem_arena' must be true or false"),
    ({"session__use_device_allocator_for_initializers": "2"}, "must be true or false"),
    ({"memory__enable_memory_arena_shrinkage": "1"}, "as 'cpu:0', 'gpu:0' or 'cpu:0;gpu:0', not '1'"),
])
def test_bad_parameter_values_are_refused(values: dict[str, str], words: str) -> None:
    config = parse_text(params(**values))
    with pytest.raises(ConveyorError) as err:
        session_options(config)
        run_options(config, "cpu")
    assert err.value.status is Status.INVALID_ARG and words in err.value.message


# --- the backend ---------------------------------------------------------------------------------


def test_options_and_run_options_serve_the_right_answer(tmp_path: Path) -> None:
    text = ext.CONFIG + params(execution_mode="1", inter_op_thread_count="2", enable_mem_pattern="0",
                               memory__enable_memory_arena_shrinkage="cpu:0") + "optimization { graph { level: 2 } }"
    path = ext.model_file_beside_data(str(tmp_path), "m", text)
    backend = OnnxRuntimeBackend(path, parse_text(text), "cpu")
    assert backend.session.get_providers() == ["CPUExecutionProvider"]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for _ in range(2):  # the arena shrinks after each run; the next one still works
        np.testing.assert_array_equal(backend.execute({"X": x}, ["Y"])["Y"], ext.expected(x))
    backend.close()


def test_accelerator_mistakes_fail_the_load(tmp_path: Path) -> None:
    path = ext.model_file_beside_data(str(tmp_path), "m", ext.CONFIG)
    unknown = 'optimization { execution_accelerators { cpu_execution_accelerator [{ name: "opnevino" }] } }'
    with pytest.raises(ConveyorError) as err:
        OnnxRuntimeBackend(path, parse_text(ext.CONFIG + unknown), "cpu")
    assert err.value.status is Status.INVALID_ARG and "unknown Execution Accelerator 'opnevino'" in err.value.message
    if "OpenVINOExecutionProvider" in ort.get_available_providers():
        return
    openvino = 'optimization { execution_accelerators { cpu_execution_accelerator [{ name: "openvino" }] } }'
    with pytest.raises(ConveyorError) as err:
        OnnxRuntimeBackend(path, parse_text(ext.CONFIG + openvino), "cpu")
    assert err.value.status is Status.UNAVAILABLE and "no OpenVINOExecutionProvider" in err.value.message


def test_gpu_accelerators_are_ignored_by_a_cpu_instance(tmp_path: Path) -> None:
    text = ext.CONFIG + """optimization { execution_accelerators { gpu_execution_accelerator [{
        name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } }] } }"""
    path = ext.model_file_beside_data(str(tmp_path), "m", text)
    backend = OnnxRuntimeBackend(path, parse_text(text), "cpu")
    assert backend.session.get_providers() == ["CPUExecutionProvider"]
    x = np.ones((1, 4), dtype=np.float32)
    np.testing.assert_array_equal(backend.execute({"X": x}, ["Y"])["Y"], ext.expected(x))


def test_model_onnx_directory_with_external_data(tmp_path: Path) -> None:
    path = ext.model_directory(str(tmp_path), "m")
    assert sorted(os.listdir(path)) == ["model.onnx", "weights.bin"]
    backend = OnnxRuntimeBackend(path, parse_text(ext.CONFIG), "cpu")  # given the directory, as the router does
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(backend.execute({"X": x}, ["Y"])["Y"], ext.expected(x))
    os.remove(os.path.join(path, "model.onnx"))
    with pytest.raises(ConveyorError) as err:
        OnnxRuntimeBackend(path, parse_text(ext.CONFIG), "cpu")
    assert err.value.status is Status.UNAVAILABLE and "unable to find" in err.value.message


def test_missing_external_data_says_so(tmp_path: Path) -> None:
    path = ext.model_file_beside_data(str(tmp_path), "m", ext.CONFIG)
    os.remove(os.path.join(os.path.dirname(path), ext.WEIGHTS))
    with pytest.raises(ConveyorError) as err:
        OnnxRuntimeBackend(path, parse_text(ext.CONFIG), "cpu")
    assert err.value.status is Status.UNAVAILABLE and "weights.bin" in err.value.message


@pytest.mark.parametrize(("config", "reason"), [
    # L0_lifecycle's test_init_error_modelfail renames the outputs: the load fails, as in Triton.
    (ext.CONFIG.replace('"Y"', '"_Y"'), "unexpected inference output '_Y', allowed outputs are: Y"),
    (ext.CONFIG.replace('"X"', '"W"'), "unexpected inference input 'W', allowed inputs are: X"),
    (ext.CONFIG.replace("TYPE_FP32 dims: [4] }]\noutput", "TYPE_INT32 dims: [4] }]\noutput"),
     "unable to load model 'm', configuration expects datatype TYPE_INT32 for input 'X', model provides TYPE_FP32"),
    (ext.CONFIG.replace('"Y" data_type: TYPE_FP32 dims: [4]', '"Y" data_type: TYPE_FP32 dims: [5]'),
     "model 'm', tensor 'Y': the model expects 2 dimensions (shape [-1,4]) but the model configuration specifies "
     "2 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, "
     "making complete shape [-1,5])"),
    (ext.CONFIG.replace("max_batch_size: 8", "max_batch_size: 0"),
     "model 'm', tensor 'X': the model expects 2 dimensions (shape [-1,4]) but the model configuration specifies "
     "1 dimensions (shape [4])"),
    (ext.CONFIG + 'input [{ name: "Z" data_type: TYPE_FP32 dims: [1] }]',
     "unable to load model 'm', configuration expects 2 inputs, model provides 1"),
])
def test_config_checked_against_the_model(tmp_path: Path, config: str, reason: str) -> None:
    path = ext.model_file_beside_data(str(tmp_path), "m", ext.CONFIG)
    with pytest.raises(ConveyorError) as err:
        OnnxRuntimeBackend(path, parse_text('name: "m"\n' + config), "cpu")
    assert err.value.message == reason and err.value.status is Status.INVALID_ARG
