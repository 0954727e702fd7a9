"""Misbehaving HTTP clients against a real group (``ingress/http/edge.py``'s limits, made
short here): each attack runs while a well-behaved client keeps asking; that client is
served throughout, the ingress's memory stays bounded, the server ends the attack's
connections by its limits, and the ingress is idle again once the attacker has gone."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from conveyor.deploy.example_repo import add_sub, identity
from conveyor.deploy.runtime.procs import cpu_seconds
from tests.support.group import Server, pids_of, start_server
from tests.support.http_attacks import (
    Attack,
    GoodClient,
    HugeHead,
    IdleConnections,
    NoRead,
    RssPeak,
    ShortBody,
    Slowloris,
    binary_identity_request,
    rss_bytes,
    tcp_connections,
)
from tests.support.waiting import eventually

LEVEL = "e2e"

MIB = 1 << 20
TIMEOUT_S = 1.5  # each of the three timeouts: the attacks' connections end this soon
MAX_CONNECTIONS = 200
HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def edge_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("edge"))
    add_sub(repo, "simple", 8)
    identity(repo, "ident")
    server = start_server(repo, f"he{os.getpid()}", "--workers", "1", "--allow-grpc", "false",
                          "--http-header-timeout-secs", str(TIMEOUT_S), "--http-body-timeout-secs", str(TIMEOUT_S),
                          "--http-write-timeout-secs", str(TIMEOUT_S),
                          "--http-max-connections", str(MAX_CONNECTIONS), grpc=False)
    warm = GoodClient(HOST, server.http_port)  # the workers' reply links to the ingress open on first use
    warm.start()
    time.sleep(0.5)
    warm.stop()
    yield server
    assert server.stop() == 0
    assert server.shm_segments() == []


def _under_attack(server: Server, attack: Attack, *, rss_bound: int, answers: set[bytes]) -> None:
    """Run ``attack`` beside a good client; check what the module's docstring says."""
    (ingress,) = pids_of(server, "ingress-http")
    sockets = tcp_connections(ingress)
    before = rss_bytes(ingress)
    good = GoodClient(HOST, server.http_port)
    good.start()
    time.sleep(0.5)  # the good client's connection is older than the attack's
    served_before = good.ok
    try:
        with RssPeak(ingress) as peak:
            attack.start()
            # The server ends every attack connection within its limits (and the time to open them all).
            eventually(lambda: attack.opened == attack.connections and attack.open == 0, 30,
                       what=f"{attack.name}: the server closed every attack connection", interval=0.1)
            time.sleep(0.5)
    finally:
        attack.stop()
        good.stop()
    assert good.failed == 0, f"{attack.name}: the good client failed {good.failed} times"
    assert good.ok - served_before >= 10, f"{attack.name}: the good client was barely served ({good.ok})"
    assert peak.peak - before < rss_bound, f"{attack.name}: ingress RSS {before / MIB:.0f} -> {peak.peak / MIB:.0f} MiB"
    assert {a.split(b" ", 2)[1] for a in attack.answers} <= answers, attack.answers
    # Idle again: no work left, no connection left.
    eventually(lambda: tcp_connections(ingress) <= sockets, 10, what=f"{attack.name}: connections released")
    cpu = cpu_seconds(ingress)
    time.sleep(1.0)
    assert cpu_seconds(ingress) - cpu < 0.1, f"{attack.name}: the ingress is still busy"


def test_slowloris(edge_server: Server) -> None:
    attack = Slowloris(HOST, edge_server.http_port, 100)
    attack.interval = 0.2
    _under_attack(edge_server, attack, rss_bound=16 * MIB, answers={b"408"})
    assert attack.answers  # told why


def test_more_idle_connections_than_the_cap(edge_server: Server) -> None:
    # Past the cap the longest-waiting connection makes room; the rest end at the header timeout.
    attack = IdleConnections(HOST, edge_server.http_port, 2 * MAX_CONNECTIONS)
    _under_attack(edge_server, attack, rss_bound=16 * MIB, answers={b"408"})


@pytest.mark.parametrize("many", [False, True], ids=["one-endless-header", "endless-header-list"])
def test_huge_request_head(edge_server: Server, many: bool) -> None:
    attack = HugeHead(HOST, edge_server.http_port, 2, limit=16 * MIB, many=many)
    _under_attack(edge_server, attack, rss_bound=16 * MIB, answers={b"431"})
    assert len(attack.answers) == 2


def test_body_shorter_than_declared(edge_server: Server) -> None:
    # Memory grows with what arrives (20 x 256 KiB), never with what is declared (20 x 512 MiB).
    attack = ShortBody(HOST, edge_server.http_port, 20, declared=512 * MIB, sent=256 << 10)
    _under_attack(edge_server, attack, rss_bound=32 * MIB, answers={b"408"})
    assert len(attack.answers) == 20


def test_client_that_never_reads_its_answers(edge_server: Server) -> None:
    request = binary_identity_request("ident", 1 << 18)  # 1 MiB in, 1 MiB out, pipelined without end
    attack = NoRead(HOST, edge_server.http_port, 2, request, count=200)
    _under_attack(edge_server, attack, rss_bound=32 * MIB, answers=set())
    assert attack.requests_sent < 50  # the server stopped reading once its answers were not read


def _chunked(port: int, chunks: int) -> bytes:
    """POST an infer body of ``chunks`` one-byte chunks; the answer's bytes (the server may stop reading early)."""
    import socket

    head = (b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n")
    with socket.create_connection((HOST, port), timeout=60) as s:
        try:
            s.sendall(head + b"1\r\nA\r\n" * chunks + b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_a_chunked_body_of_more_chunks_than_tritons_limit_is_refused(edge_server: Server) -> None:
    # Triton's kMaxChunkedChunks (qa/L0_sagemaker and L0_http request_many_chunks): at it the body is read
    # (and refused as JSON); one chunk more is a 400 in Triton's words.
    from conveyor.ingress.http.protocol import CHUNKS_REFUSAL, MAX_CHUNKED_CHUNKS

    at = _chunked(edge_server.http_port, MAX_CHUNKED_CHUNKS)
    assert at.startswith(b"HTTP/1.1 400 ") and b"failed to parse the request JSON" in at, at[:300]
    over = _chunked(edge_server.http_port, MAX_CHUNKED_CHUNKS + 1)
    assert over.startswith(b"HTTP/1.1 400 ") and CHUNKS_REFUSAL.encode() in over, over[:300]
