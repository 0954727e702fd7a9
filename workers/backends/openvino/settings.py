"""Triton's OpenVINO backend parameters (its README, "Parameters"; ``src/openvino.cc``), read once
at load, as that backend reads them:

* compile properties: ``INFERENCE_NUM_THREADS``, ``COMPILATION_NUM_THREADS`` (non-negative
  numbers), ``HINT_BF16`` (``YES``), ``NUM_STREAMS`` (``AUTO``, ``NUMA`` or a number),
  ``PERFORMANCE_HINT`` (``LATENCY``, ``THROUGHPUT``, ``CUMULATIVE_THROUGHPUT``); any case;
  a value outside these fails the load with Triton's message;
* switches that are on only when ``YES`` (any case; anything else is off, as in Triton):
  ``SKIP_OV_DYNAMIC_BATCHSIZE``, ``ENABLE_BATCH_PADDING``, ``RESHAPE_IO_LAYERS``;
* ``TARGET_DEVICE`` (default ``CPU``), ``CPU_EXTENSION_PATH``;
* Conveyor's ``CACHE_DIR``: OpenVINO's compiled-model cache (``ov::cache_dir``), so a restart
  reloads the compiled blob instead of compiling again;
* Conveyor's ``INFERENCE_PRECISION_HINT`` (``f32``, ``bf16``, ``f16``): OpenVINO's own property. On a
  CPU with bfloat16 instructions (AVX512_BF16, AMX) OpenVINO computes in bf16 unless told otherwise,
  and Triton's ``HINT_BF16`` can only ask for bf16: ``f32`` gets float32's answers there.

Triton leaves ``INFERENCE_NUM_THREADS`` to OpenVINO (every core, for every instance); Conveyor
gives the CPU default of ``workers/backends/cpu_threads.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_text
from conveyor.proto.errors import invalid_arg
from conveyor.workers.backends.cpu_threads import default_threads

# OpenVINO's precisions by the names its property takes (ov::hint::inference_precision).
_PRECISIONS = ("f32", "bf16", "f16")
_HINTS = {"latency": "LATENCY", "throughput": "THROUGHPUT", "cumulative_throughput": "CUMULATIVE_THROUGHPUT"}


def _yes(config: mc.ModelConfig, key: str) -> bool:
    """Triton's ParseBoolParameter for this backend: on only for "yes"."""
    return parameter_text(config, key).lower() == "yes"


def _number(key: str, value: str) -> str:
    if not value.isdigit():
        raise invalid_arg(f"expected the parameter '{key}' to be a non-negative number, got {value}")
    return value


def compile_properties(config: mc.ModelConfig) -> dict[str, str]:
    """The OpenVINO properties ``compile_model`` gets, by OpenVINO's property names."""
    props: dict[str, str] = {}
    for key in ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS"):
        value = parameter_text(config, key).lower()
        if value:
            props[key] = _number(key, value)
    bf16 = parameter_text(config, "HINT_BF16").lower()
    if bf16:
        if bf16 != "yes":
            raise invalid_arg(f"expected the parameter 'HINT_BF16' to be YES, got {bf16}")
        props["INFERENCE_PRECISION_HINT"] = "bf16"
    precision = parameter_text(config, "INFERENCE_PRECISION_HINT").lower()
    if precision:
        if precision not in _PRECISIONS:
            raise invalid_arg(f"expected the parameter 'INFERENCE_PRECISION_HINT' to be one of "
                              f"{'/'.join(_PRECISIONS)}, got {precision}")
        if props.get("INFERENCE_PRECISION_HINT", precision) != precision:
            raise invalid_arg("the parameters 'HINT_BF16' and 'INFERENCE_PRECISION_HINT' disagree: "
                              f"YES and {precision}")
        props["INFERENCE_PRECISION_HINT"] = precision
    streams = parameter_text(config, "NUM_STREAMS").lower()
    if streams:
        if streams not in ("auto", "numa") and not streams.isdigit():
            raise invalid_arg(f"expected the parameter 'NUM_STREAMS' to be either AUTO/NUMA/<int_value>, got {streams}")
        props["NUM_STREAMS"] = streams.upper()
    hint = parameter_text(config, "PERFORMANCE_HINT").lower()
    if hint:
        if hint not in _HINTS:
            raise invalid_arg(f"expected the parameter 'PERFORMANCE_HINT' to be LATENCY/THROUGHPUT/"
                              f"CUMULATIVE_THROUGHPUT, got {hint}")
        props["PERFORMANCE_HINT"] = _HINTS[hint]
    if "INFERENCE_NUM_THREADS" not in props:
        props["INFERENCE_NUM_THREADS"] = str(default_threads(config))
    return props


@dataclass(frozen=True, slots=True)
class OpenVinoSettings:
    properties: dict[str, str] = field(default_factory=dict)
    skip_dynamic_batch: bool = False
    batch_padding: bool = False
    reshape_io: bool = False
    device: str = "CPU"
    cpu_extension: str = ""
    cache_dir: str = ""

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> OpenVinoSettings:
        return cls(
            properties=compile_properties(config),
            skip_dynamic_batch=_yes(config, "SKIP_OV_DYNAMIC_BATCHSIZE"),
            batch_padding=_yes(config, "ENABLE_BATCH_PADDING"),
            reshape_io=_yes(config, "RESHAPE_IO_LAYERS"),
            device=parameter_text(config, "TARGET_DEVICE").upper() or "CPU",
            cpu_extension=parameter_text(config, "CPU_EXTENSION_PATH"),
            cache_dir=parameter_text(config, "CACHE_DIR"),
        )
