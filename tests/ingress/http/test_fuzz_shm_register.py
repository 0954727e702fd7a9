"""Property-based tests of shared-memory registration: any register body (HTTP JSON)
or message values (gRPC's uint64s) reach the router's registry and come back as a
registration or a protocol error, never a crash; requests that name regions are
resolved or refused with the region's own error."""

from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace
from typing import Any

import falcon.testing
import orjson
import posix_ipc
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.http.app import build_app
from conveyor.ingress.limits import IngressLimits
from conveyor.ingress.router_link import error_from
from conveyor.proto import messages as m
from conveyor.proto.control import ControlCalls
from conveyor.proto.errors import ConveyorError, Status, http_status
from conveyor.router.control_ops import shm_ops
from conveyor.router.control_table import Caller, ControlTable
from conveyor.router.repository.agent import RepositoryAgent
from conveyor.router.shared_memory.client_regions import ClientShmConfig, ClientShmRegistry
from tests.support.fuzz import bounded, tried

LEVEL = "unit"

SEGMENT = f"/conveyor-fuzz-shm.{os.getpid()}"
SEGMENT_BYTES = 4096


@pytest.fixture(scope="module", autouse=True)
def segment() -> Any:
    shm = posix_ipc.SharedMemory(SEGMENT, posix_ipc.O_CREX, size=SEGMENT_BYTES)
    shm.close_fd()
    yield
    shm.unlink()


class RegistryLink(ControlCalls):
    """A router link whose shared-memory control ops run on a real registry, keys opened on a
    real repository agent's thread as in the router."""

    def __init__(self, registry: ClientShmRegistry) -> None:
        self.agent = RepositoryAgent()
        self.answers: list[m.ControlReply] = []
        self.ops = ControlTable(shm_ops(registry, lambda ids: None, self.agent, self._answer))

    def _answer(self, caller: Caller, error: ConveyorError | None) -> None:
        err = None if error is None else m.ErrorInfo(int(error.status), error.message)
        self.answers.append(m.ControlReply(caller[1], error=err))

    async def _control(self, op: str, args: dict[str, Any], timeout_s: float) -> Any:
        reply = self.ops.handle(b"ingress", m.ControlRequest(1, op, args))
        if reply is None:  # answered once the agent opened the key
            self.agent.wait(30.0)
            reply = self.answers.pop()
        if reply.error is not None:
            raise error_from(reply.error)
        return reply.result


keys = st.sampled_from([SEGMENT, SEGMENT + "x", "", "/", "//", "/a/b", "noslash", "/\0", "/" + "k" * 300])
counts = st.one_of(  # type: ignore[var-annotated]
    st.integers(min_value=-3, max_value=SEGMENT_BYTES + 3),
    st.sampled_from([1 << 63, (1 << 64) - 1, 1 << 70]),
    st.sampled_from([1.5, "8", True, None, [1], {}]),
)
bodies = st.one_of(
    st.fixed_dictionaries({}, optional={"key": keys | st.integers(), "offset": counts, "byte_size": counts,
                                        "raw_handle": st.sampled_from([{"b64": "AAAA"}, {"b64": "!"}, "x", {}]),
                                        "device_id": counts}),
    st.lists(st.integers(), max_size=2),
)
region_names = st.sampled_from(["r", "r", "s", "a%2Fb", "%00", "x" * 200])


@bounded(100)
@given(st.lists(st.tuples(st.sampled_from(["systemsharedmemory", "cudasharedmemory"]), region_names,
                          bodies | st.binary(max_size=16)), min_size=1, max_size=4))
def test_http_register_bodies(calls: list[tuple[str, str, Any]]) -> None:
    tried("shm HTTP register body")
    registry = ClientShmRegistry(ClientShmConfig(allow=True, max_regions=2))
    dataplane = SimpleNamespace(limits=IngressLimits())  # the infer route reads its limits when built
    link = RegistryLink(registry)
    ctx = type("Ctx", (), {"link": link, "dataplane": dataplane, "drain": IngressDrain()})()
    client = falcon.testing.TestClient(build_app(ctx))
    for kind, name, body in calls:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        result = asyncio.run(_post(client, f"/v2/{kind}/region/{name}/register", data))
        event(f"HTTP {result.status_code}")
        # 500 only for a key the server cannot open: Triton's INTERNAL (--client-mistakes-as-400 makes it 400)
        assert result.status_code in (200, 400, 404, 501, 503) or (
            result.status_code == 500 and "Unable to open shared memory region" in result.text), result.text
        if result.status_code != 200:
            assert set(orjson.loads(result.content)) == {"error"}
    link.agent.close()
    assert len(registry) <= 2


async def _post(client: falcon.testing.TestClient, path: str, body: bytes) -> Any:
    async with client as conductor:
        return await conductor.simulate_post(path, body=body)


uint64s = st.integers(min_value=0, max_value=(1 << 64) - 1) | st.integers(0, SEGMENT_BYTES + 2)


@bounded(300)
@given(st.lists(st.tuples(region_names | st.text(max_size=3), keys, uint64s, uint64s), min_size=1, max_size=5),
       st.lists(st.tuples(st.sampled_from(["r", "s", "zz"]), uint64s, uint64s), max_size=3))
def test_registry_values_and_requests_naming_regions(
    registrations: list[tuple[str, str, int, int]], tensors: list[tuple[str, int, int]]
) -> None:
    tried("shm registry values")
    registry = ClientShmRegistry(ClientShmConfig(allow=True, max_regions=3))
    for name, key, offset, byte_size in registrations:
        try:
            registry.register_system(name, key, offset, byte_size)
            event("registered")
        except ConveyorError as err:
            event(f"refused: {err.status.name}")
            assert http_status(err.status) in (400, 404, 503) or err.status is Status.CLIENT_MISTAKE
    assert len(registry) <= 3
    request = m.InferRequest(
        1, "m", "", inputs=[m.TensorRef(f"in{i}", "UINT8", [n], f"{m.CLIENT_REGION_PREFIX}{name}", offset, n)
                            for i, (name, offset, n) in enumerate(tensors)],
        outputs=[],
    )
    try:
        registry.resolve(request)
    except ConveyorError as err:
        assert err.status in (Status.NOT_FOUND, Status.INVALID_ARG, Status.CLIENT_MISTAKE)
        return
    for ref in request.inputs:  # resolved: every range lies inside its registration
        region = next(r for r in request.regions if ref.region == f"{m.CLIENT_REGION_PREFIX}{r.id}")
        assert region.offset <= ref.offset and ref.offset + ref.nbytes <= region.offset + region.byte_size


def test_registrations_past_the_limit_are_unavailable() -> None:
    registry = ClientShmRegistry(ClientShmConfig(allow=True, max_regions=2))
    registry.register_system("a", SEGMENT, 0, 16)
    registry.register_system("b", SEGMENT, 0, 16)
    with pytest.raises(ConveyorError, match="--max-client-shm-regions") as err:
        registry.register_system("c", SEGMENT, 0, 16)
    assert err.value.status == Status.UNAVAILABLE
    registry.unregister("system", "a")
    registry.register_system("c", SEGMENT, 0, 16)  # room again once one is gone


def test_a_key_with_a_nul_character_is_refused_not_a_crash() -> None:
    # Found by the fuzzing above: posix_ipc segfaults on such a name, which took the router down.
    registry = ClientShmRegistry(ClientShmConfig(allow=True))
    with pytest.raises(ConveyorError, match="Unable to open shared memory region") as err:
        registry.register_system("r", "/a\0b", 0, 16)
    assert err.value.status == Status.CLIENT_MISTAKE
