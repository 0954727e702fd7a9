"""The ngh2 engine's start-up self-test (issue 44): it passes here, and a failing one makes the
ingress serve on h2 with an error logged and counted on /metrics, never silently and never not at all."""

from __future__ import annotations

import ctypes.util
import dataclasses
import logging
import os
from types import SimpleNamespace

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as tga

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.grpc.h2_server import ngh2_engine
from conveyor.ingress.grpc.server import start_server
from tests.support.extra_ingress import extra_grpc_ingress
from tests.support.fake_grpc import FakeDataPlane, FakeLink
from tests.support.group import start_server as start_group
from tests.support.metrics import scrape

LEVEL = "e2e"

FAILURES = "conveyor_grpc_ngh2_self_test_failures_total"


def test_the_self_test_passes_with_the_pinned_ngh2() -> None:
    assert ngh2_engine.self_test() == ""


def test_another_libnghttp2_in_the_process_is_named() -> None:
    maps = ("7f00-7f01 r-xp 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libnghttp2.so.14.24.1\n"
            "7f02-7f03 r-xp 00000000 08:01 13 /venv/site-packages/ngh2/_core.cpython-311-x86_64-linux-gnu.so\n")
    assert ngh2_engine.foreign_libnghttp2(maps) == ["/usr/lib/x86_64-linux-gnu/libnghttp2.so.14.24.1"]
    with open("/proc/self/maps", encoding="utf-8") as f:
        assert ngh2_engine.foreign_libnghttp2(f.read()) == []  # ngh2's own library is not one


@pytest.mark.parametrize("broken", ["version", "continuation", "ping"])
async def test_a_failed_self_test_serves_on_h2_and_says_so(
    broken: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    if broken == "version":
        monkeypatch.setattr(ngh2_engine, "PINNED_VERSION", "0.0.1")
    elif broken == "continuation":  # nghttp2 lets a CONTINUATION flood through
        monkeypatch.setattr(ngh2_engine, "_CONFIG", dataclasses.replace(ngh2_engine._CONFIG, max_continuations=1000))
    else:  # the PING flood meets no limit (the self-test sends past the configured one)
        monkeypatch.setattr(ngh2_engine, "_CONFIG", dataclasses.replace(ngh2_engine._CONFIG, max_outbound_ack=10 ** 6))
    ctx = SimpleNamespace(link=FakeLink(), dataplane=FakeDataPlane(), drain=IngressDrain())
    with caplog.at_level(logging.ERROR):
        server, port = await start_server(ctx, "127.0.0.1", 0, implementation="ngh2")  # type: ignore[arg-type]
    try:
        assert server.engine_name == "h2"
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "serving on h2 instead" in errors[0], errors
        assert {"version": "0.0.1", "continuation": "CONTINUATION flood", "ping": "PING flood"}[broken] in errors[0]
        assert ctx.link.ngh2_failures == 1  # the router is told (the hello's ngh2_failed): /metrics counts it
        client = tga.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            assert await client.is_server_live()
        finally:
            await client.close()
    finally:
        await server.stop(None)


async def test_a_passing_self_test_serves_on_ngh2(caplog: pytest.LogCaptureFixture) -> None:
    ctx = SimpleNamespace(link=FakeLink(), dataplane=FakeDataPlane(), drain=IngressDrain())
    server, _ = await start_server(ctx, "127.0.0.1", 0, implementation="ngh2")  # type: ignore[arg-type]
    try:
        assert server.engine_name == "ngh2"
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert ctx.link.ngh2_failures == 0
    finally:
        await server.stop(None)


def test_a_group_whose_self_test_fails_counts_it_on_metrics_and_serves(light_repo: str) -> None:
    """The failure the self-test exists for: another libnghttp2 loaded in the process before ngh2
    (LD_PRELOAD, which would make ngh2 crash). A real group serves gRPC on h2, and its /metrics says
    so; an ingress joined to it whose self-test passes is not counted."""
    system = ctypes.util.find_library("nghttp2")
    if system is None:
        pytest.skip("no system libnghttp2 to preload")
    group = start_group(light_repo, f"selftest{os.getpid()}", "--workers", "1",
                        env={**os.environ, "LD_PRELOAD": system})
    try:
        client = grpcclient.InferenceServerClient(group.grpc_url)
        # Readiness goes to the router on the ingress's link, behind its hellos: the count is in by then.
        assert client.is_server_ready()
        assert scrape(group)[FAILURES] == 1
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for inp in inputs:
            inp.set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), a + a)
        client.close()
        with extra_grpc_ingress(group, "--grpc-server", "ngh2") as url:  # no preload: it passes
            assert grpcclient.InferenceServerClient(url).is_server_ready()
            assert scrape(group)[FAILURES] == 1
    finally:
        assert group.stop() == 0
