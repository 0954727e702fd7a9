"""The composition roots: an actor's parsed flags (``RouterSettings``, ``WorkerSettings``) become the typed
configuration it is built from (``Router(config)``, ``Worker(config)``). The one place a router or worker flag
turns into the value the actor reads: text parsed, defaults that depend on the group filled in. The actors
cannot import deploy/'s settings classes (the import contracts), so each declares the slices it reads
(``router/config.py``, ``workers/config.py``) and this fills them in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.deploy.group_lock import DEFAULT_GROUP
from conveyor.deploy.options import default_endpoints
from conveyor.deploy.runtime.polling import spin_seconds
from conveyor.deploy.settings import RouterSettings, WorkerSettings
from conveyor.proto.triton_cli import unload_waits_for_load
from conveyor.workers.config import WorkerConfig

if TYPE_CHECKING:
    from conveyor.router.config import RouterConfig


def router_config(s: RouterSettings) -> RouterConfig:
    """What ``conveyor router`` runs with."""
    # Imported here: a worker imports this module too, and the router's modules (its lifecycle, numpy, onnx)
    # were a tenth of a second of each worker's start-up CPU.
    from conveyor.router.config import RouterConfig, SchedulingConfig, StopConfig
    from conveyor.router.lifecycle import ControlMode, ModelControlConfig
    from conveyor.router.observability.trace_settings import parse_trace_config
    from conveyor.router.repository.backend_config import BackendConfig
    from conveyor.router.response_cache import parse_cache_config
    from conveyor.router.scheduling.rate_limiter import ResourceLimit
    from conveyor.router.shared_memory.client_regions import ClientShmConfig

    group = s.group or DEFAULT_GROUP
    ingress_ep, worker_ep = default_endpoints(group)
    models = ModelControlConfig(
        mode=ControlMode(s.model_control_mode), load_at_start=tuple(s.load_model), strict_config=s.strict_model_config,
        config_name=s.model_config_name, backend_config=BackendConfig.parse(s.backend_config),
        namespacing=s.model_namespacing, poll_secs=s.repository_poll_secs, exit_on_error=s.exit_on_error,
        strict_readiness=s.strict_readiness, load_retries=s.model_load_retry_count,
        load_threads=s.model_load_thread_count, unload_waits_for_load=unload_waits_for_load())
    scheduling = SchedulingConfig(
        queue_cap=s.max_queue_size, cache_bytes=parse_cache_config(s.cache_config),
        sequence_slot_padding=s.sequence_slot_padding,
        rate_limit=s.rate_limit == "execution_count",
        rate_limit_resources=tuple(ResourceLimit.parse(r) for r in s.rate_limit_resource))
    return RouterConfig(
        repositories=tuple(s.model_repository), ingress_endpoint=s.ingress_endpoint or ingress_ep,
        worker_endpoint=s.worker_endpoint or worker_ep, group=group, spin_s=spin_seconds(s.spin_us),
        models=models, scheduling=scheduling,
        client_shm=ClientShmConfig(allow=s.allow_client_shm, max_regions=s.max_client_shm_regions),
        trace=parse_trace_config(s.trace_config),
        stop=StopConfig(exit_timeout_s=s.exit_timeout_secs, drain_grace_s=s.drain_grace_secs))


def worker_config(s: WorkerSettings) -> WorkerConfig:
    """What ``conveyor worker`` runs with."""
    group = s.group or DEFAULT_GROUP
    ingress_ep, worker_ep = default_endpoints(group)
    return WorkerConfig(
        router_endpoint=s.router or worker_ep, group=group, arena_bytes=s.arena_size,
        bls_endpoint=s.ingress_endpoint or ingress_ep, exit_timeout_s=s.exit_timeout_secs,
        spin_s=spin_seconds(s.spin_us))
