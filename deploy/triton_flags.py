"""Triton's flags that have no work to do in Conveyor's design: accepted, so that an
existing ``tritonserver`` command line runs as it is, and logged once at start with
the reason each changes nothing.

The flags that do act are in ``options.py``, shared by ``conveyor serve`` and
``tritonserver``; docs/DEPLOY.md has the whole table.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass

from conveyor.deploy.options import triton_bool

log = logging.getLogger("conveyor.flags")


@dataclass(frozen=True)
class Unused:
    flag: str
    kind: Callable[[str], object]
    reason: str
    repeatable: bool = False


_THREADS = "each ingress process is one event loop; scale them with --http-ingress / --grpc-ingress instead"
_GPU_POOL = ("each backend allocates GPU memory through its own framework (ONNX Runtime, PyTorch, TensorRT) "
             "and tensors cross processes in shared memory: the server keeps no pool of its own")

UNUSED: tuple[Unused, ...] = (
    Unused("--enable-peer-access", triton_bool,
           "tensors travel between processes through shared memory and CUDA IPC, never GPU peer copies"),
    Unused("--reuse-http-port", triton_bool,
           "every HTTP ingress process already binds with SO_REUSEPORT: that is how several share a port"),
    Unused("--reuse-grpc-port", triton_bool,
           "every gRPC ingress process already binds with SO_REUSEPORT: that is how several share a port"),
    Unused("--http-thread-count", int, _THREADS),
    Unused("--grpc-infer-allocation-pool-size", int,
           "requests are not pooled objects: each is a descriptor decoded from the wire, its tensors in the "
           "ingress's shared-memory arena"),
    Unused("--grpc-infer-response-compression-level", str,
           "responses are sent uncompressed unless the client asks for a compression algorithm on its call"),
    Unused("--backend-directory", str,
           "backends are Python modules inside Conveyor (onnxruntime, python, pytorch, tensorrt): "
           "no shared libraries are searched"),
    Unused("--repoagent-directory", str,
           "repository agents (model_repository_agents) are not run: no agent libraries are loaded"),
    Unused("--cache-directory", str, "the response cache is built into the router: no cache library is loaded"),
    Unused("--pinned-memory-pool-byte-size", int,
           "tensors live in POSIX shared-memory arenas (--arena-size); no pinned staging pool sits between "
           "them and the GPU"),
    Unused("--cuda-memory-pool-byte-size", str, _GPU_POOL, repeatable=True),
    Unused("--cuda-virtual-address-size", str,
           "implicit sequence state lives in each worker's memory, not in growable CUDA virtual memory",
           repeatable=True),
    Unused("--min-supported-compute-capability", float,
           "GPUs are chosen by CUDA_VISIBLE_DEVICES and the instance groups; workers do not filter devices by "
           "compute capability"),
    Unused("--buffer-manager-thread-count", int,
           "inputs and outputs are copied by the process that holds them, on its own thread: "
           "there is no buffer manager"),
    Unused("--host-policy", str,
           "the server pins no process to NUMA nodes or cores: pin workers with numactl/taskset or systemd's "
           "CPUAffinity=/NUMAPolicy=", repeatable=True),
    Unused("--model-load-gpu-limit", str,
           "loads are not refused on GPU memory use: each worker's framework reports out-of-memory as a "
           "failed load", repeatable=True),
    # The cloud endpoints run as one event loop each (deploy/cloud_options.py has their flags).
    Unused("--sagemaker-thread-count", int, _THREADS),
    Unused("--vertex-ai-thread-count", int, _THREADS),
)


def _dest(flag: str) -> str:
    return "unused_" + flag[2:].replace("-", "_")


def add_unused(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("Triton flags accepted but not used (logged once at start, with the reason)")
    for u in UNUSED:
        if u.flag in p._option_string_actions:
            continue  # the flag acts here (e.g. a cloud endpoint this build serves)
        group.add_argument(u.flag, dest=_dest(u.flag), type=u.kind, default=None, metavar="VALUE",
                           action="append" if u.repeatable else "store", help=f"not used: {u.reason}")


def unused_given(a: argparse.Namespace) -> list[str]:
    """One line for each unused flag on this command line."""
    out = []
    for u in UNUSED:
        value = getattr(a, _dest(u.flag), None)
        if value is None:
            continue
        shown = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
        out.append(f"{u.flag}={shown}: accepted, not used by Conveyor because {u.reason}")
    return out


def log_unused(a: argparse.Namespace, extra: list[str]) -> None:
    for line in [*unused_given(a), *extra]:
        log.warning("%s", line)
