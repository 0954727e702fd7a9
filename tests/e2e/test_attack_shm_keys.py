"""Attacks through the files clients name as shared-memory keys, against a real group started with
``--allow-client-shm=true``.

A key names an entry of /dev/shm that any local user can make. A FIFO there is the sharpest: a
blocking read-only open of it waits for a writer for ever, so the process that opens it (the
router, once for every client) would hang. Every key that is no regular file is refused at once
with Triton's error for a key it cannot open, over HTTP and gRPC; a registered segment replaced
by a FIFO is dropped by the periodic check while other clients are served; a worker that meets
such a FIFO refuses it. Every entry made in /dev/shm is removed again.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from conveyor.router.server import SHM_SWEEP_INTERVAL_S
from tests.support.group import Server
from tests.support.shm_entries import ShmEntries

LEVEL = "e2e"

pytestmark = pytest.mark.timeout(240)
NBYTES = 16 * 4  # the 'simple' model's INT32 [1, 16] tensors
# The bound on each call: a router stuck in open() answers none of them (the ingress gives up on its
# router after 30 s), a working one answers in milliseconds even on a loaded machine.
CALL_TIMEOUT_S = 20.0
# How often, at most, a client calls while waiting for the periodic check: past four of its intervals.
CHECK_ROUNDS = int(4 * SHM_SWEEP_INTERVAL_S / 0.2)


@pytest.fixture(scope="module")
def srv(client_shm_server: Server) -> Server:
    return client_shm_server  # shared with test_client_shm.py (tests/conftest.py)


@pytest.fixture
def entries() -> Iterator[ShmEntries]:
    with ShmEntries("e2e") as made:
        yield made
    assert made.left() == []  # nothing of the test's is left in /dev/shm


@pytest.fixture
def grpc(srv: Server) -> Iterator[tg.InferenceServerClient]:
    client = tg.InferenceServerClient(srv.grpc_url)
    yield client
    client.close()


def unopenable(key: str) -> str:
    """Triton's words for a key it cannot open: the key as the client gave it, no path of the server."""
    return f"Unable to open shared memory region: '{key}'"


def call_json(srv: Server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """(status, the JSON answer) of one HTTP call, bounded by CALL_TIMEOUT_S."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=CALL_TIMEOUT_S)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    return r.status, json.loads(data) if data else None


def call(srv: Server, method: str, path: str, body: Any = None) -> tuple[int, str]:
    """(status, the error message or '') of one HTTP call."""
    status, doc = call_json(srv, method, path, body)
    return status, doc["error"] if status != 200 else ""


def register(srv: Server, name: str, key: str, byte_size: int = NBYTES) -> tuple[int, str]:
    return call(srv, "POST", f"/v2/systemsharedmemory/region/{name}/register",
                {"key": key, "offset": 0, "byte_size": byte_size})


def registered(srv: Server) -> list[str]:
    status, doc = call_json(srv, "GET", "/v2/systemsharedmemory/status")
    assert status == 200, doc
    return [r["name"] for r in doc]


def infer_inline(srv: Server) -> None:
    """Another client's ordinary request: answered, and right, within CALL_TIMEOUT_S."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    body = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": a.ravel().tolist()}
                       for n in ("INPUT0", "INPUT1")]}
    status, doc = call_json(srv, "POST", "/v2/models/simple/infer", body)
    assert status == 200, doc
    assert {o["name"]: o["data"] for o in doc["outputs"]}["OUTPUT0"] == (2 * a).ravel().tolist()


def infer_from_region(srv: Server, region: str) -> tuple[int, str]:
    body = {"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16],
         "parameters": {"shared_memory_region": region, "shared_memory_byte_size": NBYTES}},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ]}
    return call(srv, "POST", "/v2/models/simple/infer", body)


def grpc_register_error(grpc: tg.InferenceServerClient, name: str, key: str) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as err:
        grpc.register_system_shared_memory(name, key, NBYTES, client_timeout=CALL_TIMEOUT_S)
    return str(err.value.status()), str(err.value.message())


def test_a_fifo_key_is_refused_at_once(srv: Server, grpc: tg.InferenceServerClient, entries: ShmEntries) -> None:
    key = entries.fifo()
    # Triton's status for a key it cannot open: INTERNAL (500), with its words and the client's key.
    assert register(srv, "fifo", key) == (500, unopenable(key))
    assert grpc_register_error(grpc, "fifo", key) == ("StatusCode.INTERNAL", unopenable(key))
    assert registered(srv) == []
    infer_inline(srv)  # nobody else waited on it


def test_keys_that_are_no_segment_are_refused(srv: Server, grpc: tg.InferenceServerClient,
                                              entries: ShmEntries) -> None:
    keys = {
        "socket": entries.unix_socket(),
        "directory": entries.directory(),
        "symlink to /dev/null": entries.symlink("/dev/null"),
        "symlink to a segment": entries.symlink(entries.path(entries.segment(NBYTES))),  # as shm_open: O_NOFOLLOW
        "a file one directory down": entries.nested_segment(),
        "/dev/shm itself": "/.",
        "its parent, /dev": "/..",
    }
    if os.geteuid() == 0:  # mknod needs CAP_MKNOD
        keys["a character device"] = entries.char_device()
    for what, key in keys.items():
        assert register(srv, "bad", key) == (500, unopenable(key)), what
        assert grpc_register_error(grpc, "bad", key) == ("StatusCode.INTERNAL", unopenable(key)), what
    assert registered(srv) == []
    infer_inline(srv)


def test_a_segment_replaced_by_a_fifo_is_dropped_while_others_are_served(srv: Server,
                                                                         entries: ShmEntries) -> None:
    key = entries.segment(NBYTES)
    assert register(srv, "victim", key) == (200, "")
    assert infer_from_region(srv, "victim") == (200, "")  # the worker maps it
    entries.replace_by_fifo(key)
    # The periodic check opens the FIFO: meanwhile another client's requests are answered, each
    # within the bound, until the region is dropped.
    for _ in range(CHECK_ROUNDS):
        infer_inline(srv)
        if "victim" not in registered(srv):
            break
        time.sleep(0.2)
    assert registered(srv) == []
    assert infer_from_region(srv, "victim") == (404, "Unable to find shared memory region: 'victim'")


def test_a_worker_refuses_a_fifo_put_in_place_of_a_registered_segment(srv: Server,
                                                                      entries: ShmEntries) -> None:
    key = entries.segment(NBYTES)
    assert register(srv, "swapped", key) == (200, "")
    entries.replace_by_fifo(key)  # before any request: the worker has not mapped it yet
    got = infer_from_region(srv, "swapped")
    # The worker met the FIFO (refused as the router would have), or the periodic check dropped
    # the region first: either way an answer, and the model's instance is free for the next.
    assert got in ((500, unopenable(key)), (404, "Unable to find shared memory region: 'swapped'")), got
    for _ in range(3):
        infer_inline(srv)
    call(srv, "POST", "/v2/systemsharedmemory/region/swapped/unregister")
    assert registered(srv) == []
