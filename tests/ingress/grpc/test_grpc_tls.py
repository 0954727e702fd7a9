"""TLS and mutual TLS on the event loop's gRPC server (``--grpc-use-ssl*``), on each HTTP/2 engine and on
both event loops (asyncio's and uvloop, the ingress process's: each has its own TLS transport), with
tritonclient's own gRPC client: the certificate files Triton's flags name, ALPN h2 only, client
certificates checked against the root certificate, and a handshake that never ends is cut off."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import hpack
import numpy as np
import pytest
import tritonclient.grpc.aio as tga
import uvloop
from hyperframe.frame import Frame, GoAwayFrame, HeadersFrame, RstStreamFrame, SettingsFrame
from tritonclient.utils import InferenceServerException

from conveyor.deploy.cli import build_parser
from conveyor.deploy.options import AUTO_GRPC_SERVER, grpc_server_choice
from conveyor.deploy.settings import GrpcIngressSettings
from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.grpc.h2_server import limits
from conveyor.ingress.grpc.h2_server import server as h2_server_module
from conveyor.ingress.grpc.h2_server.engine import ENGINES
from conveyor.ingress.grpc.server import start_server
from conveyor.ingress.grpc.tls import GrpcTls
from tests.support.certs import Certs, make_certs
from tests.support.fake_grpc import FakeDataPlane, FakeLink

LEVEL = "unit"

TIMEOUT_S = 10
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = 0x4  # the frame type of the server's first frame
CANCEL, ENHANCE_YOUR_CALM = 0x8, 0xB
Runner = Callable[[Coroutine[Any, Any, None]], None]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(str(tmp_path_factory.mktemp("certs")))


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """Another CA's: its client certificate is not signed by the server's root certificate."""
    return make_certs(str(tmp_path_factory.mktemp("other-certs")))


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner:
    def runner(main: Coroutine[Any, Any, None]) -> None:
        if request.param == "uvloop":
            uvloop.run(main)
        else:
            asyncio.run(main)
    return runner


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def serving(engine: str, tls: GrpcTls) -> AsyncIterator[str]:
    ctx = SimpleNamespace(link=FakeLink(), dataplane=FakeDataPlane(), drain=IngressDrain())
    server, port = await start_server(ctx, "127.0.0.1", 0, tls=tls, implementation=engine)  # type: ignore[arg-type]
    assert server.engine_name == engine  # the event loop's server, not grpcio
    try:
        yield f"localhost:{port}"
    finally:
        await server.stop(None)


async def infer_echo(client: tga.InferenceServerClient) -> list[float]:
    x = tga.InferInput("x", [2], "FP32")
    x.set_data_from_numpy(np.array([1.5, 2.5], dtype=np.float32))
    result = await client.infer("echo", [x], client_timeout=TIMEOUT_S)
    out = result.as_numpy("OUT_x")
    assert out is not None
    return [float(v) for v in out.view(np.float32)]


async def refused(client: tga.InferenceServerClient) -> None:
    try:
        with pytest.raises(InferenceServerException) as err:
            await client.is_server_live(client_timeout=TIMEOUT_S)
        assert err.value.status() == "StatusCode.UNAVAILABLE"
    finally:
        await client.close()


def test_tritonclient_calls_over_tls(run: Runner, engine: str, certs: Certs) -> None:
    async def main() -> None:
        async with serving(engine, GrpcTls(certs.server_cert, certs.server_key)) as url:
            client = tga.InferenceServerClient(url, ssl=True, root_certificates=certs.ca)
            try:
                assert await client.is_server_ready(client_timeout=TIMEOUT_S)
                assert await infer_echo(client) == [1.5, 2.5]
            finally:
                await client.close()
            await refused(tga.InferenceServerClient(url))  # plaintext to a TLS port
    run(main())


def test_mutual_tls_needs_a_client_certificate_signed_by_the_root(
    run: Runner, engine: str, certs: Certs, other_certs: Certs
) -> None:
    async def main() -> None:
        async with serving(engine, GrpcTls(certs.server_cert, certs.server_key, certs.ca, mutual=True)) as url:
            client = tga.InferenceServerClient(url, ssl=True, root_certificates=certs.ca,
                                               private_key=certs.client_key, certificate_chain=certs.client_cert)
            try:
                assert await infer_echo(client) == [1.5, 2.5]
            finally:
                await client.close()
            await refused(tga.InferenceServerClient(url, ssl=True, root_certificates=certs.ca))  # no certificate
            await refused(tga.InferenceServerClient(url, ssl=True, root_certificates=certs.ca,  # another CA's
                                                    private_key=other_certs.client_key,
                                                    certificate_chain=other_certs.client_cert))
    run(main())


async def first_bytes(url: str, certs: Certs, alpn: list[str] | None) -> bytes:
    """What the server sends a TLS client offering ``alpn`` (None: no ALPN) after the preface; b'' once closed."""
    ctx = ssl.create_default_context(cafile=certs.ca)
    if alpn is not None:
        ctx.set_alpn_protocols(alpn)
    host, port = url.rsplit(":", 1)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port), ssl=ctx), TIMEOUT_S)
    try:
        writer.write(PREFACE)
        return await asyncio.wait_for(reader.read(9), TIMEOUT_S)
    except (ConnectionError, ssl.SSLError):
        return b""
    finally:
        writer.close()


def test_only_clients_that_negotiate_h2_are_served(run: Runner, engine: str, certs: Certs) -> None:
    async def main() -> None:
        async with serving(engine, GrpcTls(certs.server_cert, certs.server_key)) as url:
            head = await first_bytes(url, certs, ["h2"])
            assert len(head) == 9 and head[3] == SETTINGS  # served: the server's SETTINGS
            assert await first_bytes(url, certs, ["http/1.1"]) == b""  # closed, as gRPC core's server does
            assert await first_bytes(url, certs, None) == b""
    run(main())


def test_rapid_reset_over_tls_ends_in_enhance_your_calm(run: Runner, engine: str, certs: Certs) -> None:
    """The HTTP/2 limits hold behind TLS as in plaintext (CVE-2023-44487; limits.RESET_*)."""
    async def main() -> None:
        async with serving(engine, GrpcTls(certs.server_cert, certs.server_key)) as url:
            ctx = ssl.create_default_context(cafile=certs.ca)
            ctx.set_alpn_protocols(["h2"])
            host, port = url.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx)
            encoder = hpack.Encoder()
            out = [PREFACE, SettingsFrame(0).serialize()]
            for i in range(limits.RESET_BURST + 50):
                block = encoder.encode([
                    (":method", "POST"), (":scheme", "https"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
                    (":authority", "attack"), ("content-type", "application/grpc"), ("te", "trailers")])
                out += [HeadersFrame(2 * i + 1, data=block, flags=["END_HEADERS"]).serialize(),
                        RstStreamFrame(2 * i + 1, error_code=CANCEL).serialize()]
            writer.write(b"".join(bytes(f) for f in out))

            async def goaway() -> GoAwayFrame:
                while True:
                    f, length = Frame.parse_frame_header(memoryview(await reader.readexactly(9)))
                    f.parse_body(memoryview(await reader.readexactly(length)))
                    if isinstance(f, GoAwayFrame):
                        return f

            try:
                assert (await asyncio.wait_for(goaway(), TIMEOUT_S)).error_code == ENHANCE_YOUR_CALM
            finally:
                writer.close()
    run(main())


@pytest.mark.parametrize("sent", [b"", b"\x16\x03\x01\x02\x00\x01"], ids=["nothing", "half a ClientHello"])
def test_a_handshake_that_never_ends_is_cut_off(
    monkeypatch: pytest.MonkeyPatch, run: Runner, engine: str, sent: bytes, certs: Certs
) -> None:
    monkeypatch.setattr(h2_server_module, "TLS_HANDSHAKE_TIMEOUT_S", 0.5)

    async def main() -> None:
        async with serving(engine, GrpcTls(certs.server_cert, certs.server_key)) as url:
            host, port = url.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(sent)
            # Closed after the handshake timeout (0.5 s here), well before this test's bound.
            assert await asyncio.wait_for(reader.read(), TIMEOUT_S) == b""
            writer.close()
    run(main())


@pytest.mark.parametrize(("flags", "chosen"), [
    (["--grpc-use-ssl", "true"], AUTO_GRPC_SERVER),
    (["--grpc-use-ssl-mutual", "true"], AUTO_GRPC_SERVER),
    (["--grpc-use-ssl", "true", "--grpc-keepalive-time", "1000"], AUTO_GRPC_SERVER),  # keepalive: both servers
    (["--grpc-max-connection-age", "1000", "--grpc-http2-max-ping-strikes", "0"], AUTO_GRPC_SERVER),
    (["--grpc-keepalive-time", "1000", "--grpc-server", "grpcio"], "grpcio"),
    (["--grpc-use-ssl", "true", "--grpc-server", "h2"], "h2"),
])
def test_auto_serves_tls_on_the_event_loop_server(
    monkeypatch: pytest.MonkeyPatch, flags: list[str], chosen: str
) -> None:
    monkeypatch.delenv("CONVEYOR_GRPC_SERVER", raising=False)
    args = build_parser().parse_args(["ingress", "--protocol", "grpc", *flags])
    assert grpc_server_choice(GrpcIngressSettings.of(args)) == chosen
