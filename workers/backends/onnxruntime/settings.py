"""Triton's onnxruntime backend model-config options that map onto ORT's session
and run options (its README, "Model Config Options"):

* ``optimization { graph { level } }``: -1 basic, 1 extended, 2 none, else all;
* ``parameters`` (string values): ``intra_op_thread_count``,
  ``inter_op_thread_count``, ``execution_mode`` (0 sequential, 1 parallel),
  ``enable_mem_arena``, ``enable_mem_pattern``,
  ``session.use_device_allocator_for_initializers``, and the run option
  ``memory.enable_memory_arena_shrinkage`` ("cpu:0", "gpu:0", "cpu:0;gpu:0").

Where Conveyor's defaults differ (one intra-op thread; parallel execution when
only ``inter_op_thread_count`` is set), the module says why.
"""

from __future__ import annotations

import re

import onnxruntime as ort

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_count as _count
from conveyor.proto.config_parameters import parameter_flag as _flag
from conveyor.proto.config_parameters import parameter_text as _text
from conveyor.proto.errors import invalid_arg

_ARENA_DEVICES = re.compile(r"(cpu|gpu):\d+(;(cpu|gpu):\d+)*")
SHRINKAGE = "memory.enable_memory_arena_shrinkage"
DEVICE_ALLOCATOR = "session.use_device_allocator_for_initializers"
_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}


def session_options(config: mc.ModelConfig) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    intra = _count(config, "intra_op_thread_count")
    inter = _count(config, "inter_op_thread_count")
    # NOTE: one thread by default (Triton: ORT's default, every core): each worker
    # process is already one unit of parallelism, and a session per core oversubscribes.
    opts.intra_op_num_threads = 1 if intra is None else intra
    if inter is not None:
        opts.inter_op_num_threads = inter
    mode = _text(config, "execution_mode")
    if mode not in ("", "0", "1"):
        raise invalid_arg(f"parameter 'execution_mode' must be 0 (sequential) or 1 (parallel), not '{mode}'")
    # NOTE: without execution_mode, an inter_op_thread_count means parallel (Triton runs
    # sequentially and ignores it): a thread count nothing uses is never what was meant.
    parallel = mode == "1" or (not mode and bool(inter))
    opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL if parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = _LEVELS.get(config.optimization.graph.level,
                                                ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    arena = _flag(config, "enable_mem_arena")
    if arena is not None:
        opts.enable_cpu_mem_arena = arena
    pattern = _flag(config, "enable_mem_pattern")
    if pattern is not None:
        opts.enable_mem_pattern = pattern
    device_alloc = _flag(config, DEVICE_ALLOCATOR)
    if device_alloc is not None:
        opts.add_session_config_entry(DEVICE_ALLOCATOR, "1" if device_alloc else "0")
    return opts


def run_options(config: mc.ModelConfig, device: str) -> ort.RunOptions | None:
    """Per-run options for an instance on ``device``, or None when the config sets
    none (the common case: nothing extra per call).

    ORT fails every run whose shrink list names an arena the session lacks, so that
    is refused here, at load: "cpu:0" needs the CPU arena (``enable_mem_arena`` not
    off), "gpu:N" an instance on GPU N."""
    shrink = _text(config, SHRINKAGE)
    if not shrink:
        return None
    if not _ARENA_DEVICES.fullmatch(shrink):
        raise invalid_arg(f"parameter '{SHRINKAGE}' must name the arenas to shrink after each run, "
                          f"as 'cpu:0', 'gpu:0' or 'cpu:0;gpu:0', not '{shrink}'")
    arenas = set()
    if _flag(config, "enable_mem_arena") is not False:
        arenas.add("cpu:0")
    if device.startswith("cuda"):
        arenas.add(f"gpu:{device.split(':', 1)[1] if ':' in device else 0}")
    for arena in shrink.split(";"):
        if arena not in arenas:
            raise invalid_arg(f"parameter '{SHRINKAGE}' names arena '{arena}', which this instance ({device}) "
                              f"does not have (it has {', '.join(sorted(arenas)) or 'none'})")
    opts = ort.RunOptions()
    opts.add_run_config_entry(SHRINKAGE, shrink)
    return opts
