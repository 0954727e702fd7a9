"""A hardened server end to end: gRPC over mutual TLS and HTTPS (certificates made
by the test), restricted APIs over both protocols with tritonclient's headers,
and the limits as a client meets them."""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
import tritonclient.utils.shared_memory as shm
from hyperframe.frame import Frame, SettingsFrame
from tritonclient.utils import InferenceServerException

from conveyor.ingress.grpc.h2_server.limits import MAX_CONCURRENT_STREAMS
from tests.support.certs import Certs, make_certs
from tests.support.group import Server, start_server

LEVEL = "e2e"

ADMIN = "model-repository,statistics:admin-key=s3cret"
HTTP_ADMIN = {"admin-key": "s3cret"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "s3cret"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(str(tmp_path_factory.mktemp("certs")))


@pytest.fixture(scope="module")
def hardened(light_repo: str, certs: Certs) -> Iterator[Server]:
    https = ssl.create_default_context(cafile=certs.ca)
    srv = start_server(
        light_repo, f"sec{os.getpid()}", "--workers", "1",
        "--grpc-use-ssl-mutual", "true", "--grpc-server-cert", certs.server_cert,
        "--grpc-server-key", certs.server_key, "--grpc-root-cert", certs.ca,
        "--http-ssl-cert", certs.server_cert, "--http-ssl-key", certs.server_key,
        "--http-restricted-api", ADMIN, "--grpc-restricted-protocol", ADMIN,
        "--max-input-elements", "64", "--allow-client-shm", "true", "--max-client-shm-regions", "1",
        https=https,
    )
    yield srv
    assert srv.stop() == 0


def grpc_client(server: Server, certs: Certs, *, client_cert: bool = True) -> tg.InferenceServerClient:
    return tg.InferenceServerClient(
        server.grpc_url, ssl=True, root_certificates=certs.ca,
        private_key=certs.client_key if client_cert else None,
        certificate_chain=certs.client_cert if client_cert else None,
    )


def http_client(server: Server, certs: Certs) -> th.InferenceServerClient:
    return th.InferenceServerClient(server.http_url, ssl=True, ssl_options={"ca_certs": certs.ca})


def simple_inputs(module: object, rows: int = 1) -> list[object]:
    a = np.arange(16 * rows, dtype=np.int32).reshape(rows, 16)
    make = module.InferInput  # type: ignore[attr-defined]
    return [make("INPUT0", [rows, 16], "INT32").set_data_from_numpy(a),
            make("INPUT1", [rows, 16], "INT32").set_data_from_numpy(np.ones_like(a))]


def test_grpc_over_mutual_tls(hardened: Server, certs: Certs) -> None:
    client = grpc_client(hardened, certs)
    result = client.infer("simple", simple_inputs(tg))
    assert result.as_numpy("OUTPUT0")[0, :3].tolist() == [1, 2, 3]
    # Without a client certificate, or without TLS, there is no connection at all.
    for refused in (grpc_client(hardened, certs, client_cert=False), tg.InferenceServerClient(hardened.grpc_url)):
        with pytest.raises(InferenceServerException):
            refused.is_server_live(client_timeout=10)


def test_grpc_over_tls_is_served_with_the_http2_limits(hardened: Server, certs: Certs) -> None:
    """--grpc-server auto serves TLS on the event loop's server (docs/SECURITY.md's HTTP/2 limits): its
    SETTINGS advertise the concurrent-stream limit (grpcio's advertise none)."""
    ctx = ssl.create_default_context(cafile=certs.ca)
    ctx.load_cert_chain(certs.client_cert, certs.client_key)
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", hardened.grpc_port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(SettingsFrame(0).serialize()))
        head = b""
        while len(head) < 9:
            head += tls.recv(9 - len(head))
        frame, length = Frame.parse_frame_header(memoryview(head))
        body = b""
        while len(body) < length:
            body += tls.recv(length - len(body))
        frame.parse_body(memoryview(body))
    assert isinstance(frame, SettingsFrame)
    assert frame.settings[SettingsFrame.MAX_CONCURRENT_STREAMS] == MAX_CONCURRENT_STREAMS


def test_https(hardened: Server, certs: Certs) -> None:
    client = http_client(hardened, certs)
    assert client.is_server_ready()
    result = client.infer("simple", simple_inputs(th))
    assert result.as_numpy("OUTPUT1")[0, :3].tolist() == [-1, 0, 1]
    with pytest.raises(Exception):  # noqa: B017 - plain HTTP on an HTTPS port: the connection fails
        th.InferenceServerClient(hardened.http_url, connection_timeout=10, network_timeout=10).is_server_live()


def test_restricted_apis_need_tritonclients_headers(hardened: Server, certs: Certs) -> None:
    http, grpc = http_client(hardened, certs), grpc_client(hardened, certs)
    with pytest.raises(InferenceServerException) as err:
        http.get_inference_statistics("simple")
    assert err.value.status() == "403"
    assert err.value.message() == "This API is restricted, expecting header 'admin-key'"
    with pytest.raises(InferenceServerException) as err:
        grpc.get_model_repository_index()
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    assert err.value.message() == "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
    assert http.get_inference_statistics("simple", headers=HTTP_ADMIN)["model_stats"]
    assert grpc.get_model_repository_index(headers=GRPC_ADMIN).models
    assert http.get_model_metadata("simple")["name"] == "simple"  # metadata is not restricted


def test_limits_as_a_client_meets_them(hardened: Server, certs: Certs) -> None:
    http, grpc = http_client(hardened, certs), grpc_client(hardened, certs)
    http.infer("simple", simple_inputs(th, rows=4))  # 64 elements per input: the limit
    with pytest.raises(InferenceServerException, match="--max-input-elements") as err:
        http.infer("simple", simple_inputs(th, rows=5))
    assert err.value.status() == "400"
    with pytest.raises(InferenceServerException, match="--max-input-elements") as err:
        grpc.infer("simple", simple_inputs(tg, rows=5))
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"

    handles = [shm.create_shared_memory_region(f"r{i}", f"/conveyor-sec-{os.getpid()}-{i}", 64) for i in range(2)]
    try:
        http.register_system_shared_memory("r0", f"/conveyor-sec-{os.getpid()}-0", 64)
        with pytest.raises(InferenceServerException, match="--max-client-shm-regions") as err:
            grpc.register_system_shared_memory("r1", f"/conveyor-sec-{os.getpid()}-1", 64)
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        http.unregister_system_shared_memory()
        grpc.register_system_shared_memory("r1", f"/conveyor-sec-{os.getpid()}-1", 64)
        grpc.unregister_system_shared_memory()
    finally:
        for handle in handles:
            shm.destroy_shared_memory_region(handle)
