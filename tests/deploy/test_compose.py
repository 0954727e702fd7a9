"""deploy/compose.py: every flag the router or a worker reads reaches the typed configuration it is built from
(``Router(config)``, ``Worker(config)``), and the configuration's own defaults are the flags' defaults, so an
actor built directly (tests, the in-process router core) behaves as ``conveyor router`` / ``conveyor worker``."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from conveyor.deploy.cli import _fold_triton_aliases, build_parser
from conveyor.deploy.compose import router_config, worker_config
from conveyor.deploy.options import default_endpoints
from conveyor.deploy.settings import RouterSettings, Setting, WorkerSettings
from conveyor.router.config import RouterConfig, SchedulingConfig
from conveyor.router.lifecycle import ModelControlConfig
from conveyor.router.observability.trace_settings import TraceConfig
from conveyor.router.shared_memory.client_regions import ClientShmConfig
from conveyor.workers.config import DEFAULT_ARENA_BYTES
from tests.deploy.test_settings import _sample

LEVEL = "unit"

_REPO = "--model-repository=/base"

# Every process reads these before its actor is built (deploy/cli.py's _start_actor, pin_dispatch).
_PROCESS = {"log_verbose", "log_info", "log_warning", "log_error", "log_file", "log_format", "io_sched", "dispatch_cpu"}
# Settings of the router's that its configuration does not carry, and who reads them instead.
ROUTER_READ_ELSEWHERE = _PROCESS | {
    "metrics_config",  # the latency summaries' quantiles: process-wide (configure_summaries, in deploy/cli.py)
    # Handed to the router with the rest of the metrics flags; the metrics ingress reads them.
    "allow_cpu_metrics", "allow_gpu_metrics", "metrics_interval_ms",
}
WORKER_READ_ELSEWHERE = _PROCESS | {
    "instance",  # its environment (CUDA_VISIBLE_DEVICES), set before the worker is built (deploy/instances.py)
}


def _parse(command: str, argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    a = parser.parse_args([command, *argv])
    _fold_triton_aliases(parser, a)  # Triton's aliases, folded into the flags they stand for
    return a


def _router(*argv: str) -> RouterConfig:
    return router_config(RouterSettings.of(_parse("router", [_REPO, *argv])))


@pytest.mark.parametrize("setting", [s for s in RouterSettings.settings() if s.name not in ROUTER_READ_ELSEWHERE],
                         ids=lambda s: s.flags[0])
def test_a_router_setting_reaches_its_config(setting: Setting) -> None:
    assert _router(*_sample(setting)) != _router(), f"{_sample(setting)} changed nothing the router reads"


@pytest.mark.parametrize("setting", [s for s in WorkerSettings.settings() if s.name not in WORKER_READ_ELSEWHERE],
                         ids=lambda s: s.flags[0])
def test_a_worker_setting_reaches_its_config(setting: Setting) -> None:
    def config(*argv: str) -> object:
        return worker_config(WorkerSettings.of(_parse("worker", list(argv))))

    assert config(*_sample(setting)) != config(), f"{_sample(setting)} changed nothing the worker reads"


def test_the_router_configs_defaults_are_the_flags() -> None:
    config = _router()
    assert config.models == ModelControlConfig()
    assert config.scheduling == SchedulingConfig()
    assert config.client_shm == ClientShmConfig()
    assert config.trace == TraceConfig()
    assert config.stop.exit_timeout_s == 30.0
    assert config.repositories == ("/base",) and config.group == "default"
    # What the flags place where: one of each slice.
    given = _router("--model-control-mode=explicit", "--load-model=a", "--load-model=b", "--strict-readiness=true",
                    "--max-queue-size=9", "--rate-limit=execution_count", "--rate-limit-resource=R:2",
                    "--allow-client-shm=true", "--max-client-shm-regions=5", "--drain-grace-secs=2",
                    "--ingress-endpoint=ipc:///tmp/i", "--group=g2")
    assert given.models == replace(ModelControlConfig(), mode=given.models.mode, load_at_start=("a", "b"),
                                   strict_readiness=True)
    assert given.models.mode.value == "explicit"
    assert (given.scheduling.queue_cap, given.scheduling.rate_limit) == (9, True)
    assert [(r.name, r.count) for r in given.scheduling.rate_limit_resources] == [("R", 2)]
    assert given.client_shm == ClientShmConfig(allow=True, max_regions=5)
    assert given.stop.drain_grace_s == 2.0
    # The endpoint given is used; the one not given is the group's.
    assert (given.ingress_endpoint, given.worker_endpoint) == ("ipc:///tmp/i", default_endpoints("g2")[1])


def test_the_worker_configs_defaults_are_the_flags() -> None:
    config = worker_config(WorkerSettings.of(_parse("worker", [])))
    assert (config.group, config.arena_bytes, config.exit_timeout_s) == ("default", DEFAULT_ARENA_BYTES, 30.0)
    assert (config.bls_endpoint, config.router_endpoint) == default_endpoints("default")
