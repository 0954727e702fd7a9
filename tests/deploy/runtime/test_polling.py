"""The actors' poll (deploy/runtime/polling.py): it answers what ``zmq_poll`` answers, with fewer system calls
(and, without asking, a socket whose descriptor fired for commands alone: its drain then finds nothing).

A ZeroMQ socket's descriptor is edge-triggered: a message can wait while the descriptor is quiet (its
signal consumed by an earlier question or operation), and the descriptor can fire with no message (a
peer connecting). Both cases would lose or misreport a message in a poll that only watched descriptors.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import cast

import pytest
import zmq

from conveyor.deploy.runtime.polling import Poller
from conveyor.proto.framing import drain_peers

LEVEL = "unit"

# Long enough never to pass by on a loaded test host; a failure shows as this wait, not a hang.
WAIT_MS = 10_000


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes], str]]:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    yield router, dealer, f"tcp://127.0.0.1:{port}"
    router.close(0)
    dealer.close(0)
    ctx.term()


def _wait_for_message(router: zmq.Socket[bytes]) -> None:
    """Until a message waits (asking ZMQ_EVENTS: its descriptor's signal is consumed by that)."""
    for _ in range(WAIT_MS):
        if cast(int, router.get(zmq.EVENTS)) & zmq.POLLIN:
            return
        time.sleep(0.001)
    raise AssertionError("no message arrived")


def test_a_waiting_message_behind_a_quiet_descriptor_is_answered(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes], str],
) -> None:
    router, dealer, _ = pair
    dealer.send(b"hello")
    _wait_for_message(router)  # the descriptor no longer signals: only ZMQ_EVENTS tells
    poller = Poller([router])
    assert router in poller.poll(WAIT_MS)
    assert router.recv_multipart()[1] == b"hello"


def test_plain_descriptors_are_answered_beside_a_waiting_message(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes], str],
) -> None:
    router, dealer, _ = pair
    rx, tx = os.pipe()
    try:
        os.write(tx, b"x")
        dealer.send(b"hello")
        _wait_for_message(router)
        ready = Poller([router, rx]).poll(WAIT_MS)
        assert router in ready and rx in ready  # a busy socket does not hide the wake pipe
    finally:
        os.close(rx)
        os.close(tx)


def test_a_message_that_comes_during_the_wait_ends_it(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes], str],
) -> None:
    router, dealer, endpoint = pair
    rx, tx = os.pipe()
    try:
        poller = Poller([router, rx])
        assert poller.poll(0) == {}

        def later() -> None:
            # A new peer first (its connection only wakes the router's descriptor with commands),
            # then a message from it: the poll may answer the first (the drain then finds nothing),
            # and answers the second.
            other = dealer.context.socket(zmq.DEALER)
            other.setsockopt(zmq.LINGER, 0)
            other.connect(endpoint)
            time.sleep(0.2)
            other.send(b"late")
            received.wait(WAIT_MS / 1000)  # closed (LINGER 0) only once the message has arrived
            other.close()

        received = threading.Event()
        sender = threading.Thread(target=later)
        sender.start()
        got: list[bytes] = []
        try:
            for _ in range(10):  # the connection's commands, then the message: never a timeout
                ready = poller.poll(WAIT_MS)
                assert ready == {router: zmq.POLLIN}
                drain_peers(router, bytes, lambda _, payload: got.append(payload), "the test")
                if got:
                    break
        finally:
            received.set()
            sender.join()
        assert got == [b"late"]
    finally:
        os.close(rx)
        os.close(tx)


def test_nothing_to_read_waits_out_the_timeout(pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes], str]) -> None:
    router, dealer, _ = pair
    # The connection settled first: its commands alone would wake the poll (the drain then finds nothing).
    dealer.send(b"hello")
    router.recv_multipart()
    assert not cast(int, router.get(zmq.EVENTS)) & zmq.POLLIN
    rx, tx = os.pipe()
    try:
        assert Poller([router, rx]).poll(10) == {}
        os.write(tx, b"x")
        assert Poller([router, rx]).poll(WAIT_MS) == {rx: zmq.POLLIN}
    finally:
        os.close(rx)
        os.close(tx)


def test_a_quiet_socket_is_not_asked_but_its_next_message_wakes_the_wait(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes], str],
) -> None:
    router, dealer, _ = pair
    dealer.send(b"first")
    _wait_for_message(router)
    router.recv_multipart()
    assert not cast(int, router.get(zmq.EVENTS)) & zmq.POLLIN  # asked, found empty: quiet until its next message
    poller = Poller([router])

    def later() -> None:
        time.sleep(0.2)
        dealer.send(b"second")

    sender = threading.Thread(target=later)
    sender.start()
    try:
        ready = poller.poll(WAIT_MS, quiet=[router])
    finally:
        sender.join()
    assert ready == {router: zmq.POLLIN}
    assert router.recv_multipart()[1] == b"second"
