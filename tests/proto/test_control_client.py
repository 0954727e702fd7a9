"""The typed control plane (``proto/control.py``): one ``RouterClient`` method per op of the
router's table, taking that op's arguments, and its results decoded from what a real router
answers over the wire."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import msgspec
import pytest

from conveyor.ingress.router_link import RouterLink
from conveyor.proto.control import ControlCalls, LoraAdapters, ModelDirectory, RouterClient, SignatureReply
from conveyor.proto.errors import ConveyorError, Status
from tests.support import fake_grpc, fake_http
from tests.support.fuzz_data_plane import FakeRouterLink
from tests.support.router_core import CoreClient, RouterCore, write_model

LEVEL = "unit"

# Checked by mypy: each of these is a RouterClient (the tests' stand-ins too).
CLIENTS: tuple[type[RouterClient], ...] = (ControlCalls, RouterLink, CoreClient, fake_http.FakeLink,
                                           fake_grpc.FakeLink, FakeRouterLink)


def test_every_op_of_the_router_has_its_method_with_the_ops_arguments(tmp_path: Path) -> None:
    core = RouterCore(tmp_path)
    try:
        ops = core.router.control_ops.ops
    finally:
        core.close()
    methods = {name for name, _ in inspect.getmembers(RouterClient, inspect.isfunction) if not name.startswith("_")}
    assert methods == set(ops)
    for op, entry in ops.items():
        params = list(inspect.signature(getattr(ControlCalls, op)).parameters.values())[1:]
        fields = msgspec.structs.fields(entry.args)
        assert [p.name for p in params] == [f.name for f in fields], op
        for p, f in zip(params, fields, strict=True):
            default = inspect.Parameter.empty if f.required else f.default
            assert p.default == default, (op, p.name)
        assert [p.name for p in inspect.signature(getattr(RouterClient, op)).parameters.values()][1:] == [
            p.name for p in params], op


def test_the_typed_calls_reach_a_real_router_and_read_its_answers(tmp_path: Path) -> None:
    write_model(tmp_path, "plain")
    core = RouterCore(tmp_path)
    try:
        core.serve(b"worker-1")
        client = CoreClient(core)

        async def run() -> None:
            boot, pid = await client.ping()
            assert boot == core.router.control.boot_id and pid > 0
            assert await client.server_ready() is True
            assert await client.model_ready("plain") is True
            assert await client.model_ready("plain", "7") is False
            assert (await client.model_metadata("plain"))["name"] == "plain"
            assert (await client.model_config("plain", "1"))["max_batch_size"] == 4
            assert [s["name"] for s in (await client.model_stats())["model_stats"]] == ["plain"]
            sig = await client.signature("plain")
            assert isinstance(sig, SignatureReply) and sig.signature["name"] == "plain"
            directory = await client.model_directory("plain")
            assert directory == ModelDirectory(sig.generation, str(tmp_path / "plain" / "1"), 1)
            assert [(i["model"], i["state"]) for i in await client.instances()] == [("plain", "READY")]
            assert await client.lora_adapters() == LoraAdapters(sig.generation, {})
            assert await client.shm_status("system") == []
            with pytest.raises(ConveyorError, match="--allow-client-shm"):  # off unless allowed
                await client.shm_unregister("system", "none")
            assert "log_verbose_level" in await client.log_settings()
            assert "trace_level" in await client.trace_settings()
            assert await client.held_blocks() == {"held": 0, "loans": 0, "ensembles": 0}
            assert await client.transport() == {"dispatched": 0, "direct": 0}
            with pytest.raises(ConveyorError) as err:
                await client.model_metadata("nope")
            assert err.value.status is Status.NOT_FOUND
            with pytest.raises(ConveyorError, match="polling"):  # the core's mode: its repository is polled
                await client.repository_unload("plain")

        asyncio.run(run())
    finally:
        core.close()
