"""Triton's keepalive flags on a real group (``conveyor serve``, its own gRPC ingress): a tritonclient.grpc client
with KeepAliveOptions keeps one connection across several keepalive periods, busy and idle, its calls served; a raw
HTTP/2 client is PINGed at --grpc-keepalive-time and, PINGing too often, gets GOAWAY ENHANCE_YOUR_CALM with gRPC
core's debug data "too_many_pings"."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hyperframe.frame import Frame, GoAwayFrame, PingFrame, SettingsFrame

from conveyor.deploy.example_repo import add_sub
from tests.support.group import Server, start_server

LEVEL = "e2e"

KEEPALIVE_MS = 200  # the server's PINGs
CLIENT_KEEPALIVE_MS = 100  # the client's PINGs: allowed, being further apart than the server's minimum below
MIN_PING_INTERVAL_MS = 50
MAX_STRIKES = 2
IDLE_S = 3.5
READ_TIMEOUT_S = 10.0
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ENHANCE_YOUR_CALM = 0xB


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("keepalive_models"))
    add_sub(repo, "simple", 8)
    srv = start_server(
        repo, f"ka{os.getpid()}", "--workers", "1",
        "--grpc-keepalive-time", str(KEEPALIVE_MS), "--grpc-keepalive-timeout", "5000",
        "--grpc-keepalive-permit-without-calls", "1", "--grpc-http2-max-pings-without-data", "0",
        "--grpc-http2-min-recv-ping-interval-without-data", str(MIN_PING_INTERVAL_MS),
        "--grpc-http2-max-ping-strikes", str(MAX_STRIKES))
    yield srv
    assert srv.stop() == 0


def connections_to(port: int) -> set[int]:
    """This process's established TCP connections to ``port``, by local port (Linux's /proc; IPv6 too: grpc's
    sockets to 127.0.0.1 may be IPv6 ones with a v4-mapped address)."""
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            sockets.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile
            pass
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as f:
            rows += [line.split() for line in f.readlines()[1:]]
    return {int(r[1].split(":")[1], 16) for r in rows  # local, remote, state ("01": ESTABLISHED), …, inode
            if r[3] == "01" and int(r[2].split(":")[1], 16) == port and f"socket:[{r[9]}]" in sockets}


def test_a_client_with_keepalive_keeps_its_connection_and_is_served(server: Server) -> None:
    options = grpcclient.KeepAliveOptions(keepalive_time_ms=CLIENT_KEEPALIVE_MS, keepalive_timeout_ms=5000,
                                          keepalive_permit_without_calls=True, http2_max_pings_without_data=0)
    client = grpcclient.InferenceServerClient(server.grpc_url, keepalive_options=options)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    for i in inputs:
        i.set_data_from_numpy(a)

    def call() -> None:
        assert (client.infer("simple", inputs).as_numpy("OUTPUT0") == 2 * a).all()

    try:
        call()
        first = connections_to(server.grpc_port)
        assert len(first) == 1
        calls = 0
        until = time.monotonic() + 6 * KEEPALIVE_MS / 1000  # busy: calls while both sides PING
        while time.monotonic() < until:
            call()
            calls += 1
            time.sleep(CLIENT_KEEPALIVE_MS / 2000)
        # Idle: PINGs only (permitted without calls), the server's and the client's (grpcio sends about one a
        # second then): three strikes, a GOAWAY, under gRPC's default minimum interval (5 minutes).
        time.sleep(IDLE_S)
        call()
        # One connection all along: a GOAWAY (too_many_pings) or a missed PING ACK would have made the
        # client connect again.
        assert connections_to(server.grpc_port) == first, calls
    finally:
        client.close()


class RawConnection:
    """A bare HTTP/2 client connection (hyperframe), read synchronously."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S)
        self.sock.sendall(PREFACE + bytes(SettingsFrame(0).serialize()))

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            got = self.sock.recv(n - len(out))
            if not got:
                raise ConnectionError("closed by the server")
            out += got
        return out

    def frame(self) -> Frame:
        f, length = Frame.parse_frame_header(memoryview(self._exactly(9)))
        f.parse_body(memoryview(self._exactly(length)))
        if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
            self.sock.sendall(bytes(SettingsFrame(0, flags=["ACK"]).serialize()))
        return f

    def closed(self) -> bool:
        while True:
            try:
                if not self.sock.recv(1 << 16):
                    return True
            except ConnectionResetError:
                return True


def test_the_server_pings_and_a_client_pinging_too_often_gets_too_many_pings(server: Server) -> None:
    raw = RawConnection(server.grpc_port)
    try:
        while True:  # the server's keepalive PING (permitted on a connection without calls)
            f = raw.frame()
            if isinstance(f, PingFrame) and "ACK" not in f.flags:
                break
        raw.sock.sendall(bytes(PingFrame(0, opaque_data=f.opaque_data, flags=["ACK"]).serialize()))
        # PINGs closer than --grpc-http2-min-recv-ping-interval-without-data, nothing written between: the first
        # is allowed, then MAX_STRIKES strikes, then one too many.
        raw.sock.sendall(bytes(PingFrame(0, opaque_data=b"tooclose").serialize()) * (MAX_STRIKES + 2))
        while not isinstance(f := raw.frame(), GoAwayFrame):
            pass
        assert (f.error_code, f.additional_data) == (ENHANCE_YOUR_CALM, b"too_many_pings")
        assert raw.closed()
    finally:
        raw.sock.close()
