"""Which execution providers (and options) an onnxruntime session gets from Triton's
``optimization { execution_accelerators { ... } }`` and CUDA parameters: the exact
list for each case, and the config errors, on any host (the list is built from the
providers a build reports, given here)."""

from __future__ import annotations

import pytest

from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.model_config import parse_text
from conveyor.workers.backends.onnxruntime.providers import (
    CPU,
    CUDA,
    DNNL,
    OPENVINO,
    TENSORRT,
    TRT_PARAMETERS,
    execution_providers,
)

LEVEL = "unit"

GPU_BUILD = [TENSORRT, CUDA, CPU]
EVERYTHING = [TENSORRT, CUDA, OPENVINO, DNNL, CPU]


def providers(text: str, device: str, available: list[str] = EVERYTHING) -> list[tuple[str, dict[str, str]]]:
    return execution_providers(parse_text(text), device, available)


def refused(text: str, device: str = "cuda:0", available: list[str] = EVERYTHING) -> ConveyorError:
    with pytest.raises(ConveyorError) as err:
        providers(text, device, available)
    return err.value


def test_plain_configs_run_on_cpu_or_cuda() -> None:
    assert providers("", "cpu", [CPU]) == [(CPU, {})]
    assert providers("", "cuda:1", GPU_BUILD) == [(CUDA, {"device_id": "1"}), (CPU, {})]
    assert providers("", "cuda", GPU_BUILD) == [(CUDA, {"device_id": "0"}), (CPU, {})]


def test_tensorrt_goes_before_cuda_with_triton_parameters_mapped() -> None:
    text = """optimization { execution_accelerators { gpu_execution_accelerator [{
      name: "tensorrt"
      parameters { key: "precision_mode" value: "FP16" }
      parameters { key: "max_workspace_size_bytes" value: "1073741824" }
      parameters { key: "trt_engine_cache_enable" value: "1" }
      parameters { key: "trt_engine_cache_path" value: "/tmp/engines" }
      parameters { key: "trt_max_partition_iterations" value: "10" }
      parameters { key: "trt_min_subgraph_size" value: "3" }
      parameters { key: "trt_dla_enable" value: "false" }
      parameters { key: "trt_dla_core" value: "1" }
      parameters { key: "trt_auxiliary_streams" value: "-1" }
      parameters { key: "int8_calibration_table_name" value: "calib.flatbuffers" }
    }]}}"""
    assert providers(text, "cuda:2", GPU_BUILD) == [
        (TENSORRT, {
            "trt_fp16_enable": "True",  # ORT's Python binding takes True/False for TensorRT booleans
            "trt_max_workspace_size": "1073741824",
            "trt_engine_cache_enable": "True",
            "trt_engine_cache_path": "/tmp/engines",
            "trt_max_partition_iterations": "10",
            "trt_min_subgraph_size": "3",
            "trt_dla_enable": "False",
            "trt_dla_core": "1",
            "trt_auxiliary_streams": "-1",
            "trt_int8_calibration_table_name": "calib.flatbuffers",
            "device_id": "2",
        }),
        (CUDA, {"device_id": "2"}),
        (CPU, {}),
    ]


@pytest.mark.parametrize(("mode", "option"), [("FP32", None), ("FP16", "trt_fp16_enable"),
                                              ("INT8", "trt_int8_enable"), ("BF16", "trt_bf16_enable")])
def test_precision_modes(mode: str, option: str | None) -> None:
    text = ('optimization { execution_accelerators { gpu_execution_accelerator [{ name: "tensorrt" '
            f'parameters {{ key: "precision_mode" value: "{mode}" }} }}] }} }}')
    trt = providers(text, "cuda:0", GPU_BUILD)[0][1]
    assert trt == ({option: "True"} if option else {}) | {"device_id": "0"}


def test_every_parameter_triton_documents_for_tensorrt_is_known() -> None:
    documented = {
        "precision_mode", "max_workspace_size_bytes", "int8_calibration_table_name",
        "int8_use_native_calibration_table", "trt_engine_cache_enable", "trt_engine_cache_path",
        "trt_max_partition_iterations", "trt_min_subgraph_size", "trt_dla_enable", "trt_dla_core",
        "trt_engine_cache_prefix", "trt_dump_subgraphs", "trt_force_sequential_engine_build",
        "trt_context_memory_sharing_enable", "trt_layer_norm_fp32_fallback", "trt_timing_cache_enable",
        "trt_timing_cache_path", "trt_force_timing_cache", "trt_detailed_build_log",
        "trt_build_heuristics_enable", "trt_sparsity_enable", "trt_builder_optimization_level",
        "trt_auxiliary_streams", "trt_tactic_sources", "trt_extra_plugin_lib_paths", "trt_profile_min_shapes",
        "trt_profile_max_shapes", "trt_profile_opt_shapes", "trt_cuda_graph_enable", "trt_dump_ep_context_model",
        "trt_ep_context_file_path", "trt_ep_context_embed_mode",
    }
    assert documented == TRT_PARAMETERS


def test_cuda_accelerator_and_deprecated_parameters_make_the_cuda_options() -> None:
    text = """
    parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }
    parameters { key: "gpu_mem_limit" value: { string_value: "4294967200" } }
    parameters { key: "arena_extend_strategy" value: { string_value: "1" } }
    parameters { key: "do_copy_in_default_stream" value: { string_value: "false" } }
    optimization { execution_accelerators { gpu_execution_accelerator [{
      name: "cuda"
      parameters { key: "cudnn_conv_use_max_workspace" value: "0" }
      parameters { key: "use_ep_level_unified_stream" value: "true" }
      parameters { key: "gpu_mem_limit" value: "1073741824" }
      parameters { key: "device_id" value: "7" }
    }]}}"""
    assert providers(text, "cuda:1", GPU_BUILD) == [
        (CUDA, {
            "cudnn_conv_algo_search": "HEURISTIC",
            "gpu_mem_limit": "1073741824",  # the accelerator's value wins over the deprecated parameter
            "arena_extend_strategy": "kSameAsRequested",
            "do_copy_in_default_stream": "0",  # ORT's CUDA options take booleans as 0/1
            "cudnn_conv_use_max_workspace": "0",
            "use_ep_level_unified_stream": "1",
            "device_id": "1",  # always the instance's GPU
        }),
        (CPU, {}),
    ]


def test_cpu_accelerators_follow_the_gpu_ones_on_any_instance() -> None:
    text = """optimization { execution_accelerators {
      gpu_execution_accelerator [{ name: "tensorrt" }]
      cpu_execution_accelerator [{ name: "openvino" }, { name: "dnnl" }]
    }}"""
    assert providers(text, "cuda:0") == [
        (TENSORRT, {"device_id": "0"}), (CUDA, {"device_id": "0"}),
        (OPENVINO, {"device_type": "CPU"}), (DNNL, {}), (CPU, {}),
    ]
    # A CPU instance ignores its GPU accelerators, as Triton does for KIND_CPU: TensorRT
    # need not even be installed.
    assert providers(text, "cpu", [OPENVINO, DNNL, CPU]) == [(OPENVINO, {"device_type": "CPU"}), (DNNL, {}), (CPU, {})]


def test_openvino_parameters_become_its_options() -> None:
    text = """optimization { execution_accelerators { cpu_execution_accelerator [{
      name: "openvino" parameters { key: "device_type" value: "GPU" } parameters { key: "num_of_threads" value: "2" }
    }]}}"""
    assert providers(text, "cpu")[0] == (OPENVINO, {"device_type": "GPU", "num_of_threads": "2"})


def test_an_accelerator_this_onnxruntime_lacks_fails_the_load_with_what_to_install() -> None:
    trt = 'optimization { execution_accelerators { gpu_execution_accelerator [{ name: "tensorrt" }] } }'
    err = refused(trt, "cuda:0", [CUDA, CPU])
    assert err.status is Status.UNAVAILABLE
    assert "'tensorrt' execution accelerator" in err.message and "no TensorrtExecutionProvider" in err.message
    assert "TensorRT" in err.message.split(":")[-1]
    openvino = 'optimization { execution_accelerators { cpu_execution_accelerator [{ name: "openvino" }] } }'
    err = refused(openvino, "cpu", [CPU])
    assert err.status is Status.UNAVAILABLE and "onnxruntime-openvino" in err.message
    err = refused("", "cuda:0", [CPU])
    assert err.status is Status.UNAVAILABLE and "GPU instance" in err.message and "conveyor[gpu]" in err.message


@pytest.mark.parametrize(("text", "words"), [
    ('gpu_execution_accelerator [{ name: "tensorrtx" }]', "unknown Execution Accelerator 'tensorrtx'"),
    ('gpu_execution_accelerator [{ name: "openvino" }]', "unknown Execution Accelerator 'openvino' is requested in "
                                                         "gpu_execution_accelerator"),
    ('cpu_execution_accelerator [{ name: "tensorrt" }]', "unknown Execution Accelerator 'tensorrt' is requested in "
                                                         "cpu_execution_accelerator"),
    ('gpu_execution_accelerator [{ name: "tensorrt" parameters { key: "precision" value: "FP16" } }]',
     "unknown parameter 'precision' is provided for the TensorRT execution accelerator"),
    ('gpu_execution_accelerator [{ name: "tensorrt" parameters { key: "precision_mode" value: "FP8" } }]',
     "unsupported precision mode 'FP8'"),
    ('gpu_execution_accelerator [{ name: "tensorrt" parameters { key: "trt_dla_core" value: "one" } }]',
     "'trt_dla_core' of the TensorRT execution accelerator must be an integer, not 'one'"),
    ('gpu_execution_accelerator [{ name: "tensorrt" parameters { key: "max_workspace_size_bytes" value: "-1" } }]',
     "must be at least 0"),
    ('gpu_execution_accelerator [{ name: "tensorrt" parameters { key: "trt_engine_cache_enable" value: "yes!" } }]',
     "must be true or false"),
    ('gpu_execution_accelerator [{ name: "cuda" parameters { key: "cudnn_conv_algo_search" value: "3" } }]',
     "unsupported cudnn_conv_algo_search value '3'"),
    ('gpu_execution_accelerator [{ name: "cuda" parameters { key: "arena_extend_strategy" value: "2" } }]',
     "unsupported arena_extend_strategy value '2'"),
    ('gpu_execution_accelerator [{ name: "tensorrt" }, { name: "tensorrt" }]', "'tensorrt' is given twice"),
])
def test_config_mistakes_are_refused_on_every_instance_kind(text: str, words: str) -> None:
    config = f"optimization {{ execution_accelerators {{ {text} }} }}"
    for device in ("cuda:0", "cpu"):  # a typo never waits for a GPU host to show
        err = refused(config, device)
        assert err.status is Status.INVALID_ARG and words in err.message, err.message


def test_deprecated_cuda_parameters_are_checked() -> None:
    err = refused('parameters { key: "arena_extend_strategy" value: { string_value: "5" } }')
    assert err.status is Status.INVALID_ARG and "arena_extend_strategy value '5'" in err.message
    err = refused('parameters { key: "gpu_mem_limit" value: { string_value: "lots" } }')
    assert "'gpu_mem_limit' must be an integer" in err.message
