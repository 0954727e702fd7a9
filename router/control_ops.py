"""Every control op of the router, in one table: its name, its argument struct, its handler.

Ingresses send these for the KServe/Triton extensions (metadata, readiness, statistics,
repository, shared memory, trace and log settings), workers' BLS links for
``pb_utils.load_model`` and friends, tests and operators for the rest.

To add an op: an ``Args`` struct in proto/control.py (fields and defaults are its keyword
arguments; none: ``NoArgs``) with its ``RouterClient`` method there, and one line in
``router_ops``: ``Op(TheArgs, handler)``, or ``Deferred`` when the handler answers later
itself. The args are checked once, in ``ControlTable``: a missing, unknown or mistyped one
is INVALID_ARG there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from conveyor.proto.control import (
    AnyModel,
    LogSettings,
    LoraLoad,
    LoraUnload,
    ModelVersion,
    NoArgs,
    RepositoryIndex,
    RepositoryLoad,
    RepositoryRegister,
    RepositoryUnload,
    RepositoryUnregister,
    ShmRegion,
    ShmRegister,
    TraceSettings,
)
from conveyor.proto.errors import ConveyorError
from conveyor.router.control_table import Caller, ControlTable, Deferred, Op
from conveyor.router.repository.agent import Lane, RepositoryAgent
from conveyor.router.shared_memory.client_regions import ClientShmRegistry, look

if TYPE_CHECKING:
    from conveyor.router.server import Router


# The ops a server that failed to initialize refuses with UNAVAILABLE "Server not ready", as Triton's
# (every call that needs its model manager); health, metadata, settings and shared memory still answer.
MODEL_OPS = ("model_ready", "model_metadata", "model_config", "model_stats", "signature", "repository_index",
             "repository_load", "repository_unload")


def router_ops(r: Router) -> ControlTable:
    table = _router_ops(r)
    for name in MODEL_OPS:
        table.ops[name] = _initialized_only(r.control.check_initialized, table.ops[name])
    return table


def _initialized_only(check: Callable[[], None], op: Op[Any] | Deferred[Any]) -> Op[Any] | Deferred[Any]:
    if isinstance(op, Deferred):
        deferred = op.run

        def run_deferred(args: Any, caller: Caller) -> None:
            check()
            deferred(args, caller)

        return Deferred(op.args, run_deferred)
    run = op.run

    def run_now(args: Any) -> object:
        check()
        return run(args)

    return Op(op.args, run_now)


def _router_ops(r: Router) -> ControlTable:
    c = r.control
    return ControlTable({
        # health, metadata, statistics (router/control.py)
        "ping": Op(NoArgs, lambda _: c.ping()),
        "server_ready": Op(NoArgs, lambda _: c.server_ready()),
        # deferred: a model's own is_ready() answers (router/user_readiness.py)
        "model_ready": Deferred(ModelVersion, lambda a, caller: r.user_readiness.model_ready(
            a.model, a.version, caller)),
        "model_metadata": Op(ModelVersion, lambda a: c.model_metadata(a.model, a.version)),
        "model_config": Op(ModelVersion, lambda a: c.model_config(a.model, a.version)),
        "model_stats": Op(AnyModel, lambda a: c.model_stats(a.model, a.version)),
        "signature": Op(ModelVersion, lambda a: c.signature(a.model, a.version)),
        "metrics": Op(NoArgs, lambda _: c.metrics()),
        "instances": Op(NoArgs, lambda _: c.instances()),
        "model_directory": Op(ModelVersion, lambda a: c.model_directory(a.model, a.version)),  # the OpenAI ingress
        "model_load": Op(ModelVersion, lambda a: c.model_load(a.model, a.version)),  # its ORCA load report
        # the model repository (router/lifecycle/, router/worker_pool/placement.py)
        # (the repository agent reads the disk: the index and a registration answer once it did)
        "repository_index": Deferred(RepositoryIndex, lambda a, caller: r.lifecycle.request_index(a.ready, caller)),
        "repository_load": Deferred(RepositoryLoad, lambda a, caller: r.placement.load(
            a.model, a.config, a.files, caller, a.frontend)),
        "repository_unload": Op(RepositoryUnload, lambda a: r.placement.unload(
            a.model, a.unload_dependents, a.frontend)),
        "repository_register": Deferred(RepositoryRegister, lambda a, caller: r.lifecycle.register(
            a.root, a.mapping, caller)),
        "repository_unregister": Op(RepositoryUnregister, lambda a: r.lifecycle.unregister(a.root)),
        # runtime LoRA adapters (router/runtime_lora.py; the OpenAI ingress's load/unload_lora_adapter)
        "lora_load": Deferred(LoraLoad, lambda a, caller: r.runtime_lora.load(
            a.model, a.name, a.path, a.inplace, caller)),
        "lora_unload": Op(LoraUnload, lambda a: r.runtime_lora.unload(a.name)),
        "lora_adapters": Op(NoArgs, lambda _: r.runtime_lora.listing()),
        # client shared memory (router/shared_memory/client_regions.py)
        **shm_ops(r.shm, r.forget_regions, r.agent, r.answer),
        # log and trace settings (router/settings_hub.py)
        "log_settings": Op(LogSettings, lambda a: r.settings.log_settings(a.settings)),
        "trace_settings": Op(TraceSettings, lambda a: r.settings.trace_settings(
            a.model, a.settings, lambda name: name in r.registry.models)),
        # what the router keeps of other processes' memory (tests and operators check it returns to 0)
        "held_blocks": Op(NoArgs, lambda _: {
            "held": len(r.holds), "loans": len(r.loans), "ensembles": len(r.ensembles)}),
        # how requests were answered: straight from their worker, or through the router
        "transport": Op(NoArgs, lambda _: {
            "dispatched": r.dispatcher.dispatched_items, "direct": r.dispatcher.direct_items}),
    })


def shm_ops(shm: ClientShmRegistry, forget: Callable[[list[int]], None], agent: RepositoryAgent,
            answer: Callable[[Caller, ConveyorError | None], None]) -> dict[str, Op[Any] | Deferred[Any]]:
    """The client shared-memory extension; ``forget`` tells workers to unmap ids. Each op
    first forgets the regions whose last request has ended since an unregister. A system
    registration is answered once the agent opened its key (``answer``): the loop never
    opens a file a client named."""

    def register(a: ShmRegister, caller: Caller) -> None:
        forget(shm.settle())
        if a.kind == "cuda":
            shm.register_cuda(a.name, a.handle, a.device_id, a.byte_size)
            answer(caller, None)
            return
        shm.check_system(a.name, a.key, a.offset, a.byte_size)

        def opened(looked: tuple[int, int] | Exception) -> None:
            try:
                shm.add_system(a.name, a.key, a.offset, a.byte_size, looked)
            except ConveyorError as exc:
                answer(caller, exc)
            else:
                answer(caller, None)

        agent.submit(Lane.SHM, lambda: look(a.key), opened)

    def unregister(a: ShmRegion) -> None:
        forget(shm.settle() + shm.unregister(a.kind, a.name))

    def status(a: ShmRegion) -> list[dict[str, Any]]:
        forget(shm.settle())
        return shm.status(a.kind, a.name)

    return {"shm_register": Deferred(ShmRegister, register), "shm_unregister": Op(ShmRegion, unregister),
            "shm_status": Op(ShmRegion, status)}
