"""Triton's PyTorch backend parameters (``parameters { key: "INFERENCE_MODE" ... }``)
read from a model config, and applied to torch.

Most of torch's switches are process-wide (a worker process may host several
models): the last model loaded decides them, as in Triton's backend, which
shares one process between its models too. Without ``INTRA_OP_THREAD_COUNT`` a worker runs torch
on one intra-op thread, like the onnxruntime backend: each worker process is
already one unit of parallelism and torch's default (every core) oversubscribes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import invalid_arg

log = logging.getLogger(__name__)

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _text(config: mc.ModelConfig, key: str) -> str:
    p = config.parameters.get(key)
    return p.string_value.strip() if p is not None else ""


def _flag(config: mc.ModelConfig, key: str) -> bool | None:
    """A boolean parameter, or None when the config does not set it."""
    text = _text(config, key).lower()
    if not text:
        return None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise invalid_arg(f"parameter '{key}' must be true or false, not '{text}'")


def _count(config: mc.ModelConfig, key: str) -> int | None:
    text = _text(config, key)
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise invalid_arg(f"parameter '{key}' must be a positive integer, not '{text}'")
    return int(text)


@dataclass(frozen=True, slots=True)
class TorchSettings:
    inference_mode: bool = True  # Triton's default since 23.x
    optimized_execution: bool = True
    cache_cleaning: bool = False
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    jit_executor: bool | None = None
    jit_profiling: bool | None = None
    tensor_fuser: bool | None = None
    disable_cudnn: bool | None = None

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> TorchSettings:
        inference = _flag(config, "INFERENCE_MODE")
        disable_optimized = _flag(config, "DISABLE_OPTIMIZED_EXECUTION")
        return cls(
            inference_mode=True if inference is None else inference,
            optimized_execution=not disable_optimized,
            cache_cleaning=bool(_flag(config, "ENABLE_CACHE_CLEANING")),
            intra_op_threads=_count(config, "INTRA_OP_THREAD_COUNT"),
            inter_op_threads=_count(config, "INTER_OP_THREAD_COUNT"),
            jit_executor=_flag(config, "ENABLE_JIT_EXECUTOR"),
            jit_profiling=_flag(config, "ENABLE_JIT_PROFILING"),
            tensor_fuser=_flag(config, "ENABLE_TENSOR_FUSER"),
            disable_cudnn=_flag(config, "DISABLE_CUDNN"),
        )

    def apply(self, torch: Any) -> None:
        """Set torch's process-wide switches this config asks for.

        Runs in the instance's own thread (the one that will execute it), which
        matters for OpenMP builds, where a thread count is per thread."""
        torch.set_num_threads(self.intra_op_threads or 1)
        if self.inter_op_threads is not None:
            try:
                torch.set_num_interop_threads(self.inter_op_threads)
            except RuntimeError as exc:  # torch allows it once, before any inter-op work
                log.warning("INTER_OP_THREAD_COUNT=%d not applied: %s", self.inter_op_threads, exc)
        jit = torch._C
        for value, setter in ((self.jit_executor, jit._jit_set_profiling_executor),
                              (self.jit_profiling, jit._jit_set_profiling_mode),
                              (self.tensor_fuser, jit._jit_set_texpr_fuser_enabled)):
            if value is not None:
                setter(value)
        if self.disable_cudnn is not None:
            torch.backends.cudnn.enabled = not self.disable_cudnn
