"""The router's end of a worker's link, for the worker loop's tests without a group: a
real ROUTER socket on an ipc endpoint that sends descriptors to the one worker that
connects and hands back, decoded, what the worker sent."""

from __future__ import annotations

import time
from typing import TypeVar

import zmq

from conveyor.proto import messages as m

T = TypeVar("T")


class RouterEnd:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.worker = b""  # the identity of the worker that spoke last
        self.seen: list[m.WorkerToRouter] = []  # everything received, in order
        self._backlog: list[m.WorkerToRouter] = []  # received, not yet taken by ``expect``

    def send(self, *messages: m.RouterToWorker) -> None:
        assert self.worker, "no worker has said anything yet"
        self.sock.send_multipart([self.worker, *(m.encode(msg) for msg in messages)])

    def receive(self, timeout: float) -> list[m.WorkerToRouter]:
        """The descriptors of the next message (none if nothing comes within ``timeout`` s)."""
        if not self.sock.poll(int(timeout * 1000)):
            return []
        identity, *frames = self.sock.recv_multipart()
        self.worker = identity
        got = [m.worker_decoder.decode(f) for f in frames]
        self.seen.extend(got)
        self._backlog.extend(got)
        return got

    def expect(self, kind: type[T], timeout: float = 30.0) -> T:
        """The next descriptor of ``kind`` (others on the way are kept in ``seen``)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, msg in enumerate(self._backlog):
                if isinstance(msg, kind):
                    del self._backlog[: i + 1]
                    return msg
            self._backlog.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.receive(left)
        raise AssertionError(f"no {kind.__name__} from the worker within {timeout}s")

    def close(self) -> None:
        self.sock.close(0)
