"""Which model instances may run short batches on the worker's main thread.

Handing a batch to the instance's thread and its result back costs two thread
wake-ups and two GIL hand-overs; for a small Python model that was about a
quarter of the worker's CPU per request. Running it on the main thread (the one
that owns the router socket) saves both, at the price of the main loop stalling
for the batch: so only short batches run there (``Worker._exec`` decides per
batch from the instance's recent batch times), and only for backends where the
thread does not matter.
"""

from __future__ import annotations

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.repository_files import read_text
from conveyor.workers.backends.base import Backend, RequestBackend
from conveyor.workers.backends.python.backend import PythonBackend

# A batch runs on the main thread when its instance's recent batches took less than this (Python models).
INLINE_MAX_NS = 500_000
# ... or, for a framework backend that may run on any thread (``runs_on_any_thread``: onnxruntime, fil,
# openvino, tensorflow), less than this. A framework's call after an idle gap takes 2-4 times its back-to-back
# time (caches the other actors used in between, its own threads asleep): at c=1 on the 2-vCPU VM a 100-tree
# FIL call took 550-900 µs against 130-200 back to back, so 500 µs sent nearly every such batch to its
# instance's thread, whose two hand-offs cost 0.15-0.25 ms there. Such a worker usually holds that one
# instance (one per worker is the framework backends' default), so a longer batch on the main thread
# delays no one else's; past this bound a batch is long enough that the hand-offs no longer matter.
FRAMEWORK_INLINE_MAX_NS = 2_000_000
# ... and its inputs are no larger than this: one big request after many small ones would
# otherwise stall the main loop, its heartbeats with it (a 50 MB BYTES request to a Python
# model took long enough on the main thread for the router to drop the worker as silent).
# The same with the main thread pinned to the dispatch core (deploy/runtime/dispatch_cpu.py): a lower cap
# there (64 KiB) sent megabyte batches to the instance's thread on the other core, and each one's
# hand-offs across cores cost more than its copy (docs/PERFORMANCE.md, "Megabyte batches inline").
INLINE_MAX_INPUT_BYTES = 4 << 20
INLINE_AFTER = 8  # batches measured on the instance's thread first
# Words of model.py that mean it may make BLS calls.
_BLS_WORDS = ("InferenceRequest", ".exec(", "async_exec")


def inline_allowed(backend: Backend | RequestBackend, config: mc.ModelConfig, device: str, path: str) -> bool:
    """CPU only (GPU contexts and streams are per thread); never decoupled models
    (their responses are sent from the instance's thread); never Python models that
    may call BLS: the main thread delivers BLS answers, so a call made on it would
    wait for itself."""
    if device.startswith("cuda") or config.model_transaction_policy.decoupled:
        return False
    if runs_on_any_thread(backend):
        return True  # the framework backends that say nothing ties them to their loading thread
    if isinstance(backend, PythonBackend):
        try:
            source = read_text(path, errors="replace")
        except OSError:
            return False
        return not any(word in source for word in _BLS_WORDS)
    return False


def runs_on_any_thread(backend: Backend | RequestBackend) -> bool:
    """Whether the backend says nothing ties its instance to the thread that loaded it."""
    return bool(getattr(backend, "runs_on_any_thread", False))


def inline_max_ns(backend: Backend | RequestBackend) -> int:
    """How short an instance's recent batches must be for the next to run on the main thread."""
    return FRAMEWORK_INLINE_MAX_NS if runs_on_any_thread(backend) else INLINE_MAX_NS
