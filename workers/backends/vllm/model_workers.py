"""How a vLLM engine core starts its model workers: forked, as vLLM does by default.

The worker process spawns its engine core (``VLLM_WORKER_MULTIPROC_METHOD=spawn``): it has threads and
ZeroMQ sockets that a fork would copy half-made. The engine core inherits that variable, and without this
class it spawns its own model worker too, a third process that imports vLLM (torch, transformers: on a
2-core host a third of an engine's start, and all of a CPU engine's is that). The engine core is a fresh
process whose executor starts before its I/O threads, the case vLLM's default (fork) is made for, so its
executor forks. vLLM still spawns where it must (CUDA already initialised in the engine core, and the other
cases of ``vllm.utils.system_utils._maybe_force_spawn``).

Not a CPU engine's (``engine.py`` spawns its model worker, as vLLM's own server does): vLLM binds a CPU
model worker's compute threads to their cores, and sizes their pool, through OpenMP's environment
(``GOMP_CPU_AFFINITY``/``OMP_PLACES``, ``OMP_NUM_THREADS``), set around the worker's start, which OpenMP
reads once, as it loads. A forked worker has the engine core's OpenMP, loaded before: its threads were not
bound (on 2 vCPUs they ran beside the server's, 2.3 times a spawned worker's CPU per token at 1 client and
less than half its tokens/s), and bound afterwards, its inherited pool of two threads took turns on one
core (ten times slower).

Imported by the engine core process (the executor class is pickled by name): vLLM and nothing of the worker.
"""

from __future__ import annotations

import os

from vllm.v1.executor.multiproc_executor import MultiprocExecutor

METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"


class ForkedModelWorkers(MultiprocExecutor):
    """vLLM's multiprocess executor, started by an engine core that forks its model workers."""

    def _init_executor(self) -> None:
        # In the engine core process (the executor is made there), not the worker's: what it forks inherits
        # "fork" too, vLLM's default everywhere.
        os.environ[METHOD_ENV] = "fork"
        super()._init_executor()
