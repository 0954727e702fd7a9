"""Misbehaving HTTP clients, on raw loopback sockets, for the edge tests and the benchmark
(``deploy/benchmarks/http_edge.py``): each holds its connections on a thread of its own
and counts those the server closed. Every attack is bounded (connections, bytes, time)."""

from __future__ import annotations

import http.client
import json
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

SIMPLE_BODY = json.dumps({"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
]}).encode()


def _connect(host: str, port: int, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


@dataclass
class Attack:
    """Connections held on a thread until ``stop``; ``closed`` counts those the server ended
    (EOF or reset), ``answers`` the status lines it wrote before ending them."""

    host: str
    port: int
    connections: int
    closed: int = 0
    answers: list[bytes] = field(default_factory=list)
    opened: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _socks: list[socket.socket] = field(default_factory=list)

    name = "attack"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        for sock in self._socks:
            sock.close()
        self._socks = []

    @property
    def open(self) -> int:
        return self.opened - self.closed

    def _run(self) -> None:
        raise NotImplementedError

    def _watch(self, selector: selectors.BaseSelector, timeout: float) -> None:
        """Note the connections the server answered or closed, for up to ``timeout`` seconds."""
        for key, _ in selector.select(timeout):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if data:
                if data.startswith(b"HTTP/1.1 "):
                    self.answers.append(data.split(b"\r\n", 1)[0])
                continue
            selector.unregister(sock)
            self.closed += 1


class IdleConnections(Attack):
    """Connect and send nothing."""

    name = "idle"

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for _ in range(self.connections):
                if self._stop.is_set():
                    break
                try:
                    sock = _connect(self.host, self.port)
                except OSError:
                    self.closed += 1
                    self.opened += 1
                    continue
                sock.setblocking(False)
                self._socks.append(sock)
                selector.register(sock, selectors.EVENT_READ)
                self.opened += 1
                self._watch(selector, 0)
            while not self._stop.is_set():
                self._watch(selector, 0.1)


class Slowloris(Attack):
    """A request head one byte per ``interval`` on every connection, never finished."""

    name = "slowloris"
    interval = 0.5

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for _ in range(self.connections):
                try:
                    sock = _connect(self.host, self.port)
                    sock.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nhost: x\r\nx-slow: ")
                except OSError:
                    self.closed += 1
                    self.opened += 1
                    continue
                sock.setblocking(False)
                self._socks.append(sock)
                selector.register(sock, selectors.EVENT_READ)
                self.opened += 1
            while not self._stop.is_set():
                for key in list(selector.get_map().values()):
                    try:
                        key.fileobj.send(b"a")  # type: ignore[union-attr]
                    except OSError:
                        pass  # its EOF or reset is counted by _watch
                self._watch(selector, self.interval)


class HugeHead(Attack):
    """A request head that never ends: one header value (``many=False``) or ever more small
    headers (``many=True``), as fast as the server reads, up to ``limit`` bytes a connection."""

    name = "huge-head"

    def __init__(self, host: str, port: int, connections: int, limit: int = 256 << 20, many: bool = False) -> None:
        super().__init__(host, port, connections)
        self.limit = limit
        self.many = many
        self.sent = 0

    def _one(self) -> None:
        try:
            sock = _connect(self.host, self.port)
        except OSError:
            self.closed += 1
            return
        self._socks.append(sock)
        sock.settimeout(1.0)
        if self.many:
            piece = b"".join(b"x-h%d: v\r\n" % i for i in range(4096))
        else:
            piece = b"a" * 65536
        try:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n" + (b"" if self.many else b"x-big: "))
            sent = 0
            while sent < self.limit and not self._stop.is_set():
                try:
                    sock.sendall(piece)
                except TimeoutError:
                    continue  # the server reads no more for now: try again (or stop)
                sent += len(piece)
                self.sent += len(piece)
        except OSError:
            pass
        # What did the server say (431?), and did it close the connection?
        try:
            sock.settimeout(2.0)
            data = sock.recv(65536)
            if data.startswith(b"HTTP/1.1 "):
                self.answers.append(data.split(b"\r\n", 1)[0])
            while data:
                data = sock.recv(65536)
            self.closed += 1
        except TimeoutError:
            pass  # still open
        except OSError:
            self.closed += 1

    def _run(self) -> None:
        threads = [threading.Thread(target=self._one, daemon=True) for _ in range(self.connections)]
        self.opened = len(threads)
        for t in threads:
            t.start()
        for t in threads:
            t.join()


class ShortBody(Attack):
    """A ``Content-Length`` far over what is sent: ``sent`` bytes of it, then silence."""

    name = "short-body"

    def __init__(self, host: str, port: int, connections: int, declared: int = 1 << 29, sent: int = 1 << 20) -> None:
        super().__init__(host, port, connections)
        self.declared = declared
        self.sent = sent

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for _ in range(self.connections):
                try:
                    sock = _connect(self.host, self.port)
                    sock.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nhost: x\r\n"
                                 b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % self.declared)
                    sock.sendall(b" " * self.sent)
                except OSError:
                    self.closed += 1
                    self.opened += 1
                    continue
                sock.setblocking(False)
                self._socks.append(sock)
                selector.register(sock, selectors.EVENT_READ)
                self.opened += 1
            while not self._stop.is_set():
                self._watch(selector, 0.1)


def binary_identity_request(model: str, elements: int) -> bytes:
    """One pipelined-ready POST for an FP32 identity model: ``elements`` floats in, the same out, binary both ways."""
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [elements], "datatype": "FP32",
                                     "parameters": {"binary_data_size": elements * 4}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = header + os.urandom(elements * 4)
    return (b"POST /v2/models/%s/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\n"
            b"inference-header-content-length: %d\r\ncontent-length: %d\r\n\r\n"
            % (model.encode(), len(header), len(body))) + body


class NoRead(Attack):
    """Requests pipelined back to back with large answers, none of which is ever read."""

    name = "no-read"

    def __init__(self, host: str, port: int, connections: int, request: bytes, count: int = 200) -> None:
        super().__init__(host, port, connections)
        self.request = request
        self.count = count
        self.requests_sent = 0

    def _one(self) -> None:
        try:
            sock = _connect(self.host, self.port)
        except OSError:
            self.closed += 1
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # hold as little as the kernel lets us
        self._socks.append(sock)
        sock.settimeout(0.5)
        request = memoryview(self.request)
        try:
            for _ in range(self.count):
                sent = 0
                while sent < len(request):  # by hand: sendall would lose track of a partial send on a timeout
                    try:
                        sent += sock.send(request[sent:])
                    except TimeoutError:
                        if self._stop.is_set():
                            return  # still open: the server neither read nor dropped it
                self.requests_sent += 1
            while not self._stop.is_set():
                time.sleep(0.1)
            sock.setblocking(False)  # closed by the server meanwhile? (EOF or reset once the buffer is read)
            while sock.recv(1 << 20):
                pass
            self.closed += 1
        except BlockingIOError:
            pass  # still open
        except OSError:
            self.closed += 1  # reset (or a pipe broken) by the server

    def _run(self) -> None:
        threads = [threading.Thread(target=self._one, daemon=True) for _ in range(self.connections)]
        self.opened = len(threads)
        for t in threads:
            t.start()
        for t in threads:
            t.join()


class GoodClient:
    """A well-behaved client: ``simple`` infer requests back to back on one keep-alive
    connection (a new one when the server closes it), counting answers and failures."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.ok = 0
        self.failed = 0
        self.slowest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="good-client", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        headers = {"Content-Type": "application/json"}
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                conn.request("POST", "/v2/models/simple/infer", SIMPLE_BODY, headers)
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    self.ok += 1
                else:
                    self.failed += 1
            except (OSError, http.client.HTTPException):
                self.failed += 1
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
            self.slowest = max(self.slowest, time.monotonic() - started)
        conn.close()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class RssPeak:
    """The highest RSS of ``pid`` seen every 20 ms while it runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except OSError:
                return


def tcp_connections(pid: int) -> int:
    """Sockets ``pid`` holds open (TCP and ZeroMQ alike: compare counts, not absolutes)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            continue
    return count
