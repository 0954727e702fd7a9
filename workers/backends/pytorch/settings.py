"""Triton's PyTorch backend parameters (``parameters { key: "INFERENCE_MODE" ... }``)
read from a model config, and applied to torch.

Thread counts are process-wide in torch and a worker process may host several
models: the last model loaded decides them. Without a thread count a worker
runs torch on one intra-op thread, like the onnxruntime backend: each worker
process is already one unit of parallelism and torch's default (every core)
oversubscribes. The JIT switches and cuDNN are process-wide too, but, as in
Triton's backend, each call sets the ones its model's config names, so every
model runs under its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_count, parameter_flag
from conveyor.proto.errors import invalid_arg

log = logging.getLogger(__name__)

def _count(config: mc.ModelConfig, key: str) -> int | None:
    return parameter_count(config, key, minimum=1)


def _thread_count(config: mc.ModelConfig, key: str, alias: str) -> int | None:
    """``key`` (Triton's TorchScript name) or ``alias`` (the name its model.py runtime reads)."""
    value, other = _count(config, key), _count(config, alias)
    if value is not None and other is not None and value != other:
        raise invalid_arg(f"parameters '{key}' ({value}) and '{alias}' ({other}) name the same "
                          f"thread count and disagree")
    return value if value is not None else other


@dataclass(frozen=True, slots=True)
class TorchSettings:
    inference_mode: bool = True  # Triton's default since 23.x
    optimized_execution: bool = True
    cache_cleaning: bool = False
    weight_sharing: bool = False
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    jit_executor: bool | None = None
    jit_profiling: bool | None = None
    tensor_fuser: bool | None = None
    disable_cudnn: bool = False

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> TorchSettings:
        inference = parameter_flag(config, "INFERENCE_MODE")
        if parameter_flag(config, "ENABLE_NVFUSER") is not None:
            # TorchScript's nvFuser is gone from torch 2.x; current Triton no longer reads it either.
            log.info("parameter ENABLE_NVFUSER is ignored: torch 2.x has no TorchScript nvFuser")
        return cls(
            inference_mode=True if inference is None else inference,
            optimized_execution=not parameter_flag(config, "DISABLE_OPTIMIZED_EXECUTION"),
            cache_cleaning=bool(parameter_flag(config, "ENABLE_CACHE_CLEANING")),
            weight_sharing=bool(parameter_flag(config, "ENABLE_WEIGHT_SHARING")),
            intra_op_threads=_thread_count(config, "INTRA_OP_THREAD_COUNT", "NUM_THREADS"),
            inter_op_threads=_thread_count(config, "INTER_OP_THREAD_COUNT", "NUM_INTEROP_THREADS"),
            jit_executor=parameter_flag(config, "ENABLE_JIT_EXECUTOR"),
            jit_profiling=parameter_flag(config, "ENABLE_JIT_PROFILING"),
            tensor_fuser=parameter_flag(config, "ENABLE_TENSOR_FUSER"),
            disable_cudnn=bool(parameter_flag(config, "DISABLE_CUDNN")),
        )

    def apply_threads(self, torch: Any) -> None:
        """Set torch's thread counts; at load.

        Runs in the instance's own thread (the one that will execute it), which
        matters for OpenMP builds, where a thread count is per thread."""
        torch.set_num_threads(self.intra_op_threads or 1)
        if self.inter_op_threads is not None:
            try:
                torch.set_num_interop_threads(self.inter_op_threads)
            except RuntimeError as exc:  # torch allows it once, before any inter-op work
                log.warning("INTER_OP_THREAD_COUNT=%d not applied: %s", self.inter_op_threads, exc)

    def set_for_call(self, torch: Any) -> None:
        """Before each call: cuDNN on or off, and the JIT switches this config sets
        (a few flag writes; an unset switch keeps whatever torch has)."""
        jit = torch._C
        jit._set_cudnn_enabled(not self.disable_cudnn)
        if self.jit_executor is not None:
            jit._jit_set_profiling_executor(self.jit_executor)
        if self.jit_profiling is not None:
            jit._jit_set_profiling_mode(self.jit_profiling)
        if self.tensor_fuser is not None:
            jit._jit_set_texpr_fuser_enabled(self.tensor_fuser)
