"""A worker's model instances: what it holds for each, how one loads on its own
thread, and what else the router asks of one (its readiness, forgetting sequences,
unloading). Each instance has one thread, so a long load or batch never stops the
worker's loop or its other instances.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from conveyor.deploy.runtime.dispatch_cpu import release_thread
from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.batch_shapes import BatchShapes
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.sequence_config import sequence_batched
from conveyor.workers.backends import load_backend
from conveyor.workers.backends.base import Backend, RequestBackend
from conveyor.workers.batch_io import IoPlan
from conveyor.workers.batch_layout import BatchLayout
from conveyor.workers.classification import load_labels
from conveyor.workers.devices import DeviceMap
from conveyor.workers.inline import INLINE_AFTER, INLINE_MAX_INPUT_BYTES, INLINE_MAX_NS, inline_allowed, inline_max_ns
from conveyor.workers.inline_switch import InlineSwitch
from conveyor.workers.sequence_state import SequenceSlots
from conveyor.workers.warmup import warm_up

log = logging.getLogger("conveyor.workers.worker")  # the name the worker's log lines always had

InstanceKey = tuple[str, str, int]  # (model, version, instance)
Post = Callable[[bytes], None]  # sends a descriptor to the router from any thread


@dataclass(eq=False)
class LoadedInstance:
    key: InstanceKey
    backend: Backend | RequestBackend | None
    config: mc.ModelConfig
    plan: IoPlan  # the config's tensor handling and labels, worked out at load
    # Decided once at load: a runtime Protocol check costs tens of microseconds per batch.
    per_request: bool = False
    decoupled: bool = False
    sequences: SequenceSlots | None = None  # control inputs and implicit state (sequence_batching)
    layout: BatchLayout | None = None  # ragged inputs, padding, batch inputs/outputs (array backends)
    # Its thread loads and runs the model: on every CPU, not the dispatch core (deploy/runtime/dispatch_cpu.py).
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, initializer=release_thread))
    # Short batches of a backend that allows it run on the main thread (see ``BatchRunner.run``).
    inline_ok: bool = False
    inline_max_ns: int = INLINE_MAX_NS  # its bound on ``exec_ns`` (``workers/inline.py``)
    exec_ns: float = 0.0  # recent batch time, an EWMA
    batches: int = 0
    # Tasks handed to the executor and finished; each counter has one writer thread.
    submitted: int = 0
    finished: int = 0

    def submit(self, task: Callable[[], None]) -> concurrent.futures.Future[None]:
        """Run ``task`` on this instance's thread, after the tasks already given to it."""
        self.submitted += 1

        def run() -> None:
            try:
                task()
            finally:
                self.finished += 1

        return self.executor.submit(run)

    def runs_inline(self, msg: m.ExecBatch) -> bool:
        """Whether this batch may run on the main thread: the backend allows it, nothing is
        queued on the instance's thread (order), its batches are short, and its inputs are
        no larger than ``INLINE_MAX_INPUT_BYTES``."""
        return (self.inline_ok and self.submitted == self.finished and self.batches >= INLINE_AFTER
                and self.exec_ns < self.inline_max_ns and InlineSwitch.on
                and _input_bytes(msg) <= INLINE_MAX_INPUT_BYTES)


def begin_load(msg: m.LoadModel, devices: DeviceMap, post: Post) -> LoadedInstance:
    """The instance ``msg`` asks for, to enter at once (batches for it queue behind its load);
    its model loads on its thread, which posts ``ModelLoaded`` when done."""
    key = (msg.model, msg.version, msg.instance)
    config = mc.ModelConfig.FromString(msg.config)
    device = devices.local(msg.device)  # the router names physical GPUs
    inst = LoadedInstance(key, None, config, IoPlan.from_config(config, {}))

    def load() -> None:
        error = ""
        try:
            model_dir = os.path.dirname(os.path.dirname(msg.path))
            inst.plan = IoPlan.from_config(config, load_labels(model_dir, config))
            if sequence_batched(config):
                inst.sequences = SequenceSlots(config, model_dir)
            backend = load_backend(config.backend, msg.path, config, device, msg.instance, msg.name, post)
            inst.per_request = isinstance(backend, RequestBackend)
            inst.decoupled = inst.per_request and config.model_transaction_policy.decoupled
            shapes = BatchShapes.from_config(config)
            if shapes.active and not inst.per_request:  # a request backend sees each request as sent
                inst.layout = BatchLayout(shapes)
            if config.model_warmup:
                try:
                    warm_up(backend, config, model_dir, inst.per_request, inst.layout, msg.name)
                except BaseException:
                    backend.close()  # a failed warmup fails the instance, as in Triton
                    raise
            inst.inline_ok = inline_allowed(backend, config, device, msg.path)
            inst.inline_max_ns = inline_max_ns(backend)
            inst.backend = backend
        except ConveyorError as exc:
            error = exc.message
        except Exception as exc:
            log.exception("loading %s failed", key)
            error = f"{type(exc).__name__}: {exc}"
        log.debug("instance %s loaded%s", key, f": {error}" if error else "")
        user_ready = not error and bool(getattr(inst.backend, "has_readiness", False))  # Python models only
        evictions = not error and bool(getattr(inst.backend, "reports_evictions", False))  # vLLM engines
        post(m.encode(m.ModelLoaded(msg.model, msg.version, msg.instance, error, user_ready, evictions)))

    inst.submit(load)
    return inst


def close_instance(inst: LoadedInstance) -> concurrent.futures.Future[None]:
    """Close its model (a Python model's ``finalize``) after the batches already given to its
    thread, then let the thread go. Done when the model is closed."""

    def close() -> None:
        if inst.backend is not None:
            inst.backend.close()

    closed = inst.submit(close)
    inst.executor.shutdown(wait=False)
    return closed


def check_readiness(inst: LoadedInstance | None, msg: m.ReadyCheck, post: Post) -> None:
    """The model's own readiness check (a Python model's ``is_ready()``), off the main thread:
    ``ReadyChecked`` when it is done (joined to a check of the instance still running)."""
    backend = inst.backend if inst is not None else None
    readiness = getattr(backend, "readiness", None) if getattr(backend, "has_readiness", False) else None
    if readiness is None:
        post(m.encode(m.ReadyChecked(msg.check, False)))
        return

    def answer(done: concurrent.futures.Future[bool]) -> None:
        post(m.encode(m.ReadyChecked(msg.check, done.result())))

    readiness().add_done_callback(answer)


def update_adapter(inst: LoadedInstance | None, msg: m.LoraUpdate, post: Post) -> None:
    """A runtime LoRA adapter added to (or removed from) the instance's engine; ``LoraUpdated`` when
    the engine has it. The backend learns the name at once, so the batches the router sends after
    this message find it."""
    backend = inst.backend if inst is not None else None
    update = getattr(backend, "update_adapter", None)

    def answer(error: ConveyorError | None) -> None:
        if msg.check or error is not None:  # check 0: nobody waits; a failure is still worth a log line
            info = None if error is None else m.ErrorInfo(int(error.status), error.message)
            post(m.encode(m.LoraUpdated(msg.check, info)))

    if backend is None:
        answer(ConveyorError(Status.UNAVAILABLE, f"model '{msg.model}' version {msg.version} is not loaded here"))
        return
    if update is None:
        answer(ConveyorError(Status.INVALID_ARG, f"model '{msg.model}' takes no LoRA adapters: it is not a vLLM model"))
        return

    def done(future: concurrent.futures.Future[None]) -> None:
        exc = future.exception()
        if exc is None:
            answer(None)
        elif isinstance(exc, ConveyorError):
            answer(exc)
        else:
            answer(ConveyorError(Status.INTERNAL, f"{type(exc).__name__}: {exc}"))

    update(msg.name, msg.path).add_done_callback(done)


def forget_sequences(inst: LoadedInstance | None, msg: m.ForgetSequences) -> None:
    if inst is not None and inst.sequences is not None:
        sequences, slots = inst.sequences, msg.slots
        inst.submit(lambda: sequences.forget(slots))  # after the batches already submitted


def _input_bytes(msg: m.ExecBatch) -> int:
    total = 0  # loops, not a generator: asked for every batch of an instance that may run inline
    for item in msg.items:
        for ref in item.inputs:
            total += ref.nbytes
    return total
