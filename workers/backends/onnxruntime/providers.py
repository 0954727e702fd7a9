"""The onnxruntime execution providers a model instance's session gets, with their
options, from Triton's model config:

* ``optimization { execution_accelerators { gpu_execution_accelerator [...] } }``:
  ``tensorrt`` (TensorrtExecutionProvider, ahead of CUDA) and ``cuda`` (options of
  the CUDA provider every GPU instance runs on); used by GPU instances only, as in
  Triton, but checked for every instance so a typo never waits for a GPU host.
* ``cpu_execution_accelerator [...]``: ``openvino`` (as Triton) and ``dnnl``
  (oneDNN, a Conveyor addition), after the GPU providers on any instance.
* the CUDA parameters Triton reads from the model's ``parameters`` (deprecated
  there, still honoured): ``cudnn_conv_algo_search``, ``gpu_mem_limit``,
  ``arena_extend_strategy``, ``do_copy_in_default_stream``.

Pure (no onnxruntime import): the caller passes the providers its onnxruntime
build has, so every case can be checked on a CPU-only host. A config mistake is
INVALID_ARG; an accelerator this build lacks is UNAVAILABLE with what to install
(Triton refuses it too: there is no silent fallback).
"""

from __future__ import annotations

from collections.abc import Collection

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parse_bool
from conveyor.proto.errors import invalid_arg, unavailable

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
OPENVINO = "OpenVINOExecutionProvider"
DNNL = "DnnlExecutionProvider"
CPU = "CPUExecutionProvider"

Provider = tuple[str, dict[str, str]]

GPU_ACCELERATORS = ("tensorrt", "cuda")
CPU_ACCELERATORS = {"openvino": OPENVINO, "dnnl": DNNL}

INSTALL = {
    CUDA: "install conveyor[gpu] (onnxruntime-gpu) on a host with a GPU",
    TENSORRT: "install onnxruntime-gpu and TensorRT's libraries (the tensorrt package) on the GPU host",
    OPENVINO: "install onnxruntime-openvino in place of onnxruntime",
    DNNL: "use an onnxruntime built with oneDNN (--use_dnnl)",
}

def _int(value: str, what: str, minimum: int | None = None) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise invalid_arg(f"{what} must be an integer, not '{value}'") from None
    if minimum is not None and number < minimum:
        raise invalid_arg(f"{what} must be at least {minimum}, not '{value}'")
    return number


# --- TensorRT ------------------------------------------------------------------------------------

# Triton's TensorRT accelerator parameters (its README's mapping table) -> the TensorRT
# provider's option, by kind of value. ORT's Python binding takes booleans as "True"/"False".
_TRT_SIZE = {"max_workspace_size_bytes": "trt_max_workspace_size"}
_TRT_INT = {
    "trt_max_partition_iterations": "trt_max_partition_iterations",
    "trt_min_subgraph_size": "trt_min_subgraph_size",
    "trt_dla_core": "trt_dla_core",
    "trt_builder_optimization_level": "trt_builder_optimization_level",
    "trt_auxiliary_streams": "trt_auxiliary_streams",
    "trt_ep_context_embed_mode": "trt_ep_context_embed_mode",
}
_TRT_BOOL = {
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
    "trt_dla_enable": "trt_dla_enable",
    "trt_engine_cache_enable": "trt_engine_cache_enable",
    "trt_dump_subgraphs": "trt_dump_subgraphs",
    "trt_force_sequential_engine_build": "trt_force_sequential_engine_build",
    "trt_context_memory_sharing_enable": "trt_context_memory_sharing_enable",
    "trt_layer_norm_fp32_fallback": "trt_layer_norm_fp32_fallback",
    "trt_timing_cache_enable": "trt_timing_cache_enable",
    "trt_force_timing_cache": "trt_force_timing_cache",
    "trt_detailed_build_log": "trt_detailed_build_log",
    "trt_build_heuristics_enable": "trt_build_heuristics_enable",
    "trt_sparsity_enable": "trt_sparsity_enable",
    "trt_cuda_graph_enable": "trt_cuda_graph_enable",
    "trt_dump_ep_context_model": "trt_dump_ep_context_model",
}
_TRT_TEXT = {
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "trt_engine_cache_path": "trt_engine_cache_path",
    "trt_engine_cache_prefix": "trt_engine_cache_prefix",
    "trt_timing_cache_path": "trt_timing_cache_path",
    "trt_tactic_sources": "trt_tactic_sources",
    "trt_extra_plugin_lib_paths": "trt_extra_plugin_lib_paths",
    "trt_profile_min_shapes": "trt_profile_min_shapes",
    "trt_profile_max_shapes": "trt_profile_max_shapes",
    "trt_profile_opt_shapes": "trt_profile_opt_shapes",
    "trt_ep_context_file_path": "trt_ep_context_file_path",
}
# precision_mode -> the option that turns it on (FP32 is TensorRT's default: none).
_PRECISION = {"FP32": "", "FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable", "INT8": "trt_int8_enable"}
TRT_PARAMETERS = frozenset(["precision_mode", *_TRT_SIZE, *_TRT_INT, *_TRT_BOOL, *_TRT_TEXT])


def tensorrt_options(parameters: dict[str, str], device_id: int) -> dict[str, str]:
    """The TensorRT provider's options for a ``tensorrt`` accelerator's parameters."""
    options: dict[str, str] = {}
    for key in sorted(parameters):
        value = parameters[key]
        what = f"parameter '{key}' of the TensorRT execution accelerator"
        if key == "precision_mode":
            if value not in _PRECISION:
                raise invalid_arg(f"unsupported precision mode '{value}' is requested for the TensorRT execution "
                                  f"accelerator (one of {', '.join(_PRECISION)})")
            if _PRECISION[value]:
                options[_PRECISION[value]] = "True"
        elif key in _TRT_SIZE:
            options[_TRT_SIZE[key]] = str(_int(value, what, minimum=0))
        elif key in _TRT_INT:
            options[_TRT_INT[key]] = str(_int(value, what))
        elif key in _TRT_BOOL:
            options[_TRT_BOOL[key]] = "True" if parse_bool(value, what) else "False"
        elif key in _TRT_TEXT:
            if value:  # as Triton: an empty value leaves the provider's default
                options[_TRT_TEXT[key]] = value
        else:
            raise invalid_arg(f"unknown parameter '{key}' is provided for the TensorRT execution accelerator "
                              f"(known: {', '.join(sorted(TRT_PARAMETERS))})")
    options["device_id"] = str(device_id)  # the instance's GPU, whatever the config says
    return options


# --- CUDA ----------------------------------------------------------------------------------------

# CUDA provider options that are booleans: ORT parses them as 0/1.
_CUDA_BOOL = frozenset([
    "do_copy_in_default_stream", "use_ep_level_unified_stream", "cudnn_conv_use_max_workspace",
    "cudnn_conv1d_pad_to_nc1d", "enable_cuda_graph", "enable_skip_layer_norm_strict_mode", "use_tf32",
    "prefer_nhwc", "tunable_op_enable", "tunable_op_tuning_enable", "fuse_conv_bias",
])
# Triton's numeric spellings (its deprecated model parameters) of two enumerations.
_CONV_ALGO = {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"}
_ARENA = {"0": "kNextPowerOfTwo", "1": "kSameAsRequested"}
# Set by the backend itself: the instance's GPU and stream.
_CUDA_OWN = frozenset(["device_id", "has_user_compute_stream", "user_compute_stream"])
_DEPRECATED_CUDA = ("cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy", "do_copy_in_default_stream")


def _cuda_option(key: str, value: str, what: str) -> str:
    if key in _CUDA_BOOL:
        return "1" if parse_bool(value, what) else "0"
    if key == "cudnn_conv_algo_search":
        named = _CONV_ALGO.get(value.strip(), value.strip())
        if named not in _CONV_ALGO.values():
            raise invalid_arg(f"unsupported cudnn_conv_algo_search value '{value}' is requested "
                              "(0 EXHAUSTIVE, 1 HEURISTIC or 2 DEFAULT)")
        return named
    if key == "arena_extend_strategy":
        named = _ARENA.get(value.strip(), value.strip())
        if named not in _ARENA.values():
            raise invalid_arg(f"unsupported arena_extend_strategy value '{value}' is requested "
                              "(0 kNextPowerOfTwo or 1 kSameAsRequested)")
        return named
    if key == "gpu_mem_limit":
        return str(_int(value, what, minimum=1))
    return value


def cuda_options(config: mc.ModelConfig, accelerator: dict[str, str], device_id: int) -> dict[str, str]:
    """The CUDA provider's options: Triton's deprecated model parameters first, then
    the ``cuda`` accelerator's parameters (which win where both set a key). Other
    keys go to onnxruntime as given, which refuses those it does not know."""
    options: dict[str, str] = {}
    for key in _DEPRECATED_CUDA:
        p = config.parameters.get(key)
        if p is not None and p.string_value.strip():
            options[key] = _cuda_option(key, p.string_value, f"parameter '{key}'")
    for key in sorted(accelerator):
        if key not in _CUDA_OWN and accelerator[key]:
            options[key] = _cuda_option(key, accelerator[key],
                                        f"parameter '{key}' of the CUDA execution accelerator")
    options["device_id"] = str(device_id)
    return options


# --- the list --------------------------------------------------------------------------------------


def execution_providers(config: mc.ModelConfig, device: str, available: Collection[str]) -> list[Provider]:
    """The providers, in priority order, for an instance on ``device`` ("cpu", "cuda"
    or "cuda:N"); ``available`` is ``onnxruntime.get_available_providers()``.

    GPU instance: TensorRT (when asked) before CUDA, then the CPU accelerators, then
    CPU. CPU instance: the CPU accelerators, then CPU; its GPU accelerators are
    checked but not used (as Triton ignores them for KIND_CPU)."""
    eas = config.optimization.execution_accelerators
    device_id = int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0
    gpu: list[Provider] = []
    cuda_params: dict[str, str] = {}
    for ea in eas.gpu_execution_accelerator:
        if ea.name == "tensorrt":
            _once(gpu, TENSORRT, ea.name)
            gpu.append((TENSORRT, tensorrt_options(dict(ea.parameters), device_id)))
        elif ea.name == "cuda":
            cuda_params.update(ea.parameters)  # as Triton: several 'cuda' entries add up
        else:
            raise _unknown(ea.name, "gpu_execution_accelerator", GPU_ACCELERATORS)
    gpu.append((CUDA, cuda_options(config, cuda_params, device_id)))
    providers = gpu if device.startswith("cuda") else []
    cpu: list[Provider] = []
    for ea in eas.cpu_execution_accelerator:
        provider = CPU_ACCELERATORS.get(ea.name)
        if provider is None:
            raise _unknown(ea.name, "cpu_execution_accelerator", tuple(CPU_ACCELERATORS))
        _once(cpu, provider, ea.name)
        # NOTE: Triton gives OpenVINO device_type CPU and no parameters; Conveyor hands the
        # accelerator's parameters on as the provider's options (onnxruntime checks them).
        cpu.append((provider, ({"device_type": "CPU"} if provider == OPENVINO else {}) | dict(ea.parameters)))
    providers += [*cpu, (CPU, {})]
    for name, _ in providers:
        if name != CPU and name not in available:
            raise unavailable(
                f"the config asks for {_ASKED[name]} but this onnxruntime has no {name} "
                f"(it has {', '.join(sorted(available)) or 'none'}): {INSTALL[name]}"
            )
    return providers


_ASKED = {
    CUDA: "a GPU instance",
    TENSORRT: "the 'tensorrt' execution accelerator",
    OPENVINO: "the 'openvino' execution accelerator",
    DNNL: "the 'dnnl' execution accelerator",
}


def _once(providers: list[Provider], provider: str, name: str) -> None:
    if any(p == provider for p, _ in providers):
        raise invalid_arg(f"execution accelerator '{name}' is given twice")


def _unknown(name: str, field: str, known: tuple[str, ...]) -> Exception:
    return invalid_arg(f"unknown Execution Accelerator '{name}' is requested in {field} "
                       f"(the onnxruntime backend knows {', '.join(repr(k) for k in known)})")
