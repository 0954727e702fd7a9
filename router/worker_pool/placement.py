"""Where model instances run, and the lifecycle's decisions carried out on the workers:
``LoadModel`` for unplaced instances, ``UnloadModel`` for retired ones, answers to
``repository_load``/``repository_unload`` once the model settled."""

from __future__ import annotations

import logging

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError
from conveyor.router.context import RouterContext
from conveyor.router.control_table import Caller
from conveyor.router.lifecycle import ModelLifecycle
from conveyor.router.models import Instance, InstanceState, default_instance_name
from conveyor.router.repository.default_groups import backend_gpus, resolve
from conveyor.router.spec.namespaces import name_of

log = logging.getLogger(__name__)


class Placement:
    def __init__(self, ctx: RouterContext, lifecycle: ModelLifecycle) -> None:
        self.front = ctx.front
        self.back = ctx.back
        self.registry = ctx.registry
        self.pool = ctx.pool
        self.ledger = ctx.ledger  # instances with a batch on them are not unloaded yet
        self.limiter = ctx.limiter
        self.lifecycle = lifecycle

    def load(self, name: str, config: str, files: dict[str, bytes] | None, caller: Caller,
             frontend: bool = False) -> None:
        """``repository_load``: the repository agent looks at the repository afresh and prepares
        the model; ``caller`` is answered once the model settled (``settle``)."""
        self.lifecycle.load(name, caller, config, files or None, frontend)

    def unload(self, name: str, dependents: bool, frontend: bool = False) -> None:
        """``repository_unload``: answered at once."""
        self.lifecycle.unload(name, dependents, frontend)
        self.place()
        self.settle()

    def place(self) -> None:
        """Give per-worker models (no instance_group) one instance per worker, then
        send every unplaced instance to a worker."""
        workers = len(self.pool.workers)
        for state in self.registry.live_versions():
            if workers and state.auto_gpus is None:
                # Triton's default / KIND_AUTO placement, on the GPUs of workers that can run the backend there
                gpus = backend_gpus(self.pool.workers.values(), state.config.backend)
                resolve(state, gpus, self.registry.next_index)
            if state.per_worker and not state.error:
                for _ in range(workers - len(state.instances)):
                    state.instances.append(
                        Instance(state, self.registry.next_index(), "cpu", name=default_instance_name(state))
                    )
        self._place_instances()

    def settle(self) -> None:
        """Let the lifecycle swap, fail or retire entries; answer load calls (and the calls the
        repository agent answers); unload retired instances that have nothing left to do."""
        if not self.lifecycle.busy:
            return
        out = self.lifecycle.settle(self.ledger.busy_instances(), self.pool.workers.keys())
        for answer in out.answers:
            identity, cid = answer.reply_to
            error = answer.error
            err = None if error is None else m.ErrorInfo(int(error.status), error.message)
            self.front.send(identity, m.encode(m.ControlReply(cid, result=answer.result, error=err)))
        for model, label in dict.fromkeys((i.version.model, i.version.label) for i in out.unload):
            log.info("successfully unloaded '%s' version %s", name_of(model), label)  # Triton's line
        for inst in out.unload + out.shrink:
            worker = self.pool.workers.get(inst.worker) if inst.worker is not None else None
            if worker is not None:
                if inst in worker.instances:
                    worker.instances.remove(inst)
                st = inst.version
                self.back.send(worker.identity, m.encode(m.UnloadModel(st.model, st.label, inst.index)))
            inst.worker = None
            if self.limiter is not None:
                self.limiter.unregister(inst)

    def _place_instances(self) -> None:
        pending = [i for s in self.registry.live_versions() if not s.error for i in s.instances]
        if self.limiter is not None:
            self._register_limits(pending)
            pending = [i for i in pending if not i.version.error]
        for inst in self.pool.place(pending):
            st = inst.version
            assert inst.worker is not None
            load = m.LoadModel(st.model, st.label, st.path, st.config.SerializeToString(), inst.index, inst.load_device,
                               inst.name)
            self.back.send(inst.worker, m.encode(load))

    def _register_limits(self, instances: list[Instance]) -> None:
        """Rate limiting: an instance whose resources can never be met fails its model version's load, its
        other instances with it (Triton's rule: the model does not load)."""
        assert self.limiter is not None
        for inst in instances:
            if inst.state is InstanceState.UNPLACED and not inst.version.error:
                try:
                    self.limiter.register(inst)
                except ConveyorError as exc:
                    version = inst.version
                    version.error = exc.message
                    for other in version.instances:
                        if other.state is InstanceState.UNPLACED:
                            self.limiter.unregister(other)
                            other.state, other.error = InstanceState.FAILED, exc.message
                    log.error("model '%s' version %s cannot load: %s", version.model, version.label, exc.message)
