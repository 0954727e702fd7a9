"""Triton's rate limiter: resource accounting and turns (unit), and two models
sharing one resource never executing at the same time (end to end)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError
from conveyor.router.lifecycle import instance_update
from conveyor.router.models import Instance, VersionState, build_entry
from conveyor.router.scheduling.rate_limiter import ALL_DEVICES, RateLimiter, ResourceLimit
from conveyor.router.spec.model_spec import ModelSpec
from tests.support import rate_limit_models
from tests.support.group import Server, start_server

LEVEL = "e2e"


def version(name: str, groups: str) -> VersionState:
    config = text_format.Parse(f'name: "{name}" {groups}', mc.ModelConfig())
    return build_entry(ModelSpec(name, "/x", config, versions={1: "/x/1/m"})).versions[1]


def group(resources: str, count: int = 1, priority: int = 0, kind: str = "KIND_CPU") -> str:
    return (f"instance_group [ {{ count: {count} kind: {kind} "
            f"rate_limiter {{ resources [ {resources} ] priority: {priority} }} }} ]")


def registered(limiter: RateLimiter, state: VersionState) -> list[Instance]:
    for inst in state.instances:
        limiter.register(inst)
    return state.instances


def test_resource_limit_flags_parse_as_triton_writes_them() -> None:
    assert ResourceLimit.parse("R1:10") == ResourceLimit("R1", 10, ALL_DEVICES)
    assert ResourceLimit.parse("R2:5:1") == ResourceLimit("R2", 5, 1)
    for bad in ("R1", "R1:x", ":3", "R1:3:-1", "R1:1:2:3"):
        with pytest.raises(ValueError, match="expected <name>:<count>"):
            ResourceLimit.parse(bad)


def test_by_default_a_resource_has_the_largest_count_any_instance_needs() -> None:
    limiter = RateLimiter([])
    a1, a2 = registered(limiter, version("a", group('{ name: "R" count: 2 }', count=2)))
    (b,) = registered(limiter, version("b", group('{ name: "R" count: 1 }')))
    limiter.acquire(a1)
    assert not limiter.free(a2) and not limiter.free(b)  # 2 of 2 taken
    limiter.release(a1)
    limiter.acquire(b)
    assert not limiter.free(a2)  # needs 2, one is left
    limiter.acquire(b)  # a second execution of b's (its instance is one; this is accounting only)
    assert not limiter.free(b)
    limiter.release(b)
    limiter.release(b)
    assert limiter.free(a1) and limiter.free(a2)


def test_per_device_resources_are_counted_per_device_and_global_ones_once() -> None:
    limiter = RateLimiter([])
    gpu0, gpu1 = registered(limiter, version("g", group('{ name: "D" count: 1 }', kind="KIND_GPU")
                                             .replace("count: 1 kind", "count: 1 gpus: [0, 1] kind")))
    assert (gpu0.device, gpu1.device) == ("cuda:0", "cuda:1")
    limiter.acquire(gpu0)
    assert limiter.free(gpu1)  # D exists once per device
    limiter.release(gpu0)
    x, y = registered(limiter, version("s", group('{ name: "S" count: 1 global: true }', count=2)))
    limiter.acquire(x)
    assert not limiter.free(y)


def test_explicit_counts_replace_the_default_and_too_few_fail_the_instance() -> None:
    limiter = RateLimiter([ResourceLimit("R", 1), ResourceLimit("R", 4, 0)])
    (a,) = registered(limiter, version("a", group('{ name: "R" count: 2 }')))
    limiter.acquire(a)
    assert limiter.free(a)  # 4 copies on device 0: the largest given for it
    limiter.acquire(a)
    assert not limiter.free(a)
    with pytest.raises(ConveyorError, match='Resource count for "big" is limited to 0 which will prevent '
                                            "scheduling of one or more model instances, the minimum required "
                                            "count is 1"):
        registered(limiter, version("b", group('{ name: "big" count: 1 }')))


def test_one_name_cannot_be_global_and_per_device() -> None:
    limiter = RateLimiter([])
    registered(limiter, version("a", group('{ name: "R" count: 1 }')))
    with pytest.raises(ConveyorError, match='Resource "R" is present as both global and device-specific'):
        registered(limiter, version("b", group('{ name: "R" count: 1 global: true }')))
    limiter.unregister(Instance(version("c", ""), 0, "cpu"))  # unknown instances are ignored


def test_an_instance_update_registers_each_instance_with_its_own_group(caplog: pytest.LogCaptureFixture) -> None:
    """Triton's instance update (router/lifecycle/instance_update.py): an added instance sits after the kept ones,
    not where its group is in the config; it needs its own group's resources, and the default limit follows the
    instances there are (L0_model_update's resource increase and decrease, and its verbose map line)."""
    caplog.set_level("DEBUG", logger="conveyor.router.scheduling.rate_limiter")
    limiter = RateLimiter([])
    state = version("m", group('{ name: "R1" count: 4 }'))
    (old,) = registered(limiter, state)
    changed = text_format.Parse('name: "m" ' + group('{ name: "R1" count: 3 }'), mc.ModelConfig())
    spec = ModelSpec("m", "/x", changed, versions={1: "/x/1/m"})
    entry = build_entry(ModelSpec("m", "/x", state.config, versions={1: "/x/1/m"}))
    entry.versions[1] = state
    update = instance_update.begin(entry, spec, iter(range(100, 200)).__next__)
    (added,) = update.versions[0].added
    assert update.versions[0].removed == [old]
    limiter.register(added)
    limiter.acquire(added)
    assert not limiter.free(old)  # 3 of the 4 taken: old needs 4
    limiter.release(added)
    limiter.unregister(old)  # the largest need left is 3
    assert limiter.free(added)
    assert '\\t\\tResource: R1\\t Count: 3\\n' in caplog.text  # Triton's escaped log line


def test_waiting_versions_are_served_by_turn_lower_priority_values_first() -> None:
    limiter = RateLimiter([])
    (fast,) = registered(limiter, version("fast", group('{ name: "R" count: 1 }', priority=1)))
    (slow,) = registered(limiter, version("slow", group('{ name: "R" count: 1 }', priority=2)))
    order = []
    for _ in range(6):
        limiter.wait(slow.version)
        limiter.wait(fast.version)
        first = limiter.take_waiting()[0]
        order.append(first.model)
        inst = first.instances[0]
        limiter.acquire(inst)
        limiter.release(inst)
    assert order.count("fast") == 4 and order.count("slow") == 2  # priority 2: half the turns


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("ratelimited"))
    rate_limit_models.build(repo)
    srv = start_server(repo, f"rl{os.getpid()}", "--workers", "2", "--rate-limit", "execution_count",
                       "--rate-limit-resource", "R:1", "--rate-limit-resource", "big:2")
    yield srv
    assert srv.stop() == 0


def interval(server: Server, model: str) -> tuple[float, float]:
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("INPUT0", [1], "FP32").set_data_from_numpy(np.ones(1, np.float32))
    start, end = client.infer(model, [inp], timeout=60).as_numpy("OUTPUT0").tolist()
    client.close()
    return start, end


def test_models_sharing_a_resource_of_one_never_execute_together(limited_server: Server) -> None:
    models = ["rl_a", "rl_b"] * 12
    with ThreadPoolExecutor(8) as pool:
        intervals = sorted(pool.map(lambda name: interval(limited_server, name), models))
    assert len(intervals) == len(models)
    for (_, end), (start, _) in pairwise(intervals):
        assert start >= end, "two executions holding the one copy of R overlapped"


def test_an_instance_needing_more_than_the_server_has_fails_to_load(limited_server: Server) -> None:
    client = httpclient.InferenceServerClient(limited_server.http_url)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["rl_big"]["state"] == "UNAVAILABLE"
    assert index["rl_big"]["reason"] == ('Resource count for "big" is limited to 2 which will prevent scheduling '
                                         "of one or more model instances, the minimum required count is 3")
    # One instance that can never run fails the whole model, its other instance with it (qa/L0_rate_limiter:
    # the server does not start with --exit-on-error).
    assert index["rl_half"]["state"] == "UNAVAILABLE" and "is limited to 2" in index["rl_half"]["reason"]
    assert client.is_model_ready("rl_a") and client.is_model_ready("rl_b")
