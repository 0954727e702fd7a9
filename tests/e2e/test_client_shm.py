"""Client system shared memory, end to end: tritonclient's own shm helpers against
a real server started with ``--allow-client-shm=true``, over HTTP and gRPC.

The worker reads inputs from, and writes outputs into, the client's segment; the
responses carry no bytes for those tensors. Bad registrations and requests get
the protocol's error and leave the server, and the workers' mappings, clean.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import posix_ipc
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conveyor.deploy.runtime.procs import children
from tests.support.group import Server
from tests.support.waiting import eventually

LEVEL = "e2e"

pytestmark = pytest.mark.timeout(120)
NBYTES = 16 * 4  # the 'simple' model's INT32 [1, 16] tensors


@pytest.fixture(scope="module")
def shm_server(client_shm_server: Server) -> Server:
    return client_shm_server  # shared with test_attack_shm_keys.py (tests/conftest.py)


@pytest.fixture
def regions() -> Iterator[Callable[[str, int], Any]]:
    """Creates client segments (as tritonclient does) and destroys them after the test."""
    made: list[Any] = []
    tag = f"{os.getpid()}_{time.monotonic_ns()}"

    def make(name: str, size: int) -> Any:
        handle = shm.create_shared_memory_region(name, f"/cv_test_{name}_{tag}", size)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        try:
            shm.destroy_shared_memory_region(handle)
        except Exception:
            pass  # a test removed it itself


def key_of(handle: Any) -> str:
    return str(handle._shm_key)


@pytest.fixture
def httpc(shm_server: Server) -> Iterator[th.InferenceServerClient]:
    client = th.InferenceServerClient(shm_server.http_url)
    yield client
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture
def grpc(shm_server: Server) -> Iterator[tg.InferenceServerClient]:
    client = tg.InferenceServerClient(shm_server.grpc_url)
    yield client
    client.unregister_system_shared_memory()
    client.close()


def worker_maps(srv: Server) -> str:
    """Every worker's memory map, to see which client segments it holds."""
    pids = [p for p, argv in children(srv.proc.pid).items() if "worker" in argv]
    assert pids
    out = []
    for pid in pids:
        with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
            out.append(f.read())
    return "\n".join(out)


def operands() -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    return a, np.full((1, 16), 3, dtype=np.int32)


# --- the happy paths -------------------------------------------------------------------------


def test_http_inputs_and_outputs_in_shared_memory(httpc: th.InferenceServerClient, regions: Any,
                                                  shm_server: Server) -> None:
    a, b = operands()
    ins, outs = regions("in", 2 * NBYTES), regions("out", 2 * NBYTES)
    shm.set_shared_memory_region(ins, [a, b])
    httpc.register_system_shared_memory("in", key_of(ins), 2 * NBYTES)
    httpc.register_system_shared_memory("out", key_of(outs), 2 * NBYTES)
    status = {r["name"]: r for r in httpc.get_system_shared_memory_status()}
    assert status["in"] == {"name": "in", "key": key_of(ins), "offset": 0, "byte_size": 2 * NBYTES}

    inputs = [th.InferInput("INPUT0", [1, 16], "INT32"), th.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("in", NBYTES)
    inputs[1].set_shared_memory("in", NBYTES, offset=NBYTES)
    outputs = [th.InferRequestedOutput("OUTPUT0"), th.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("out", NBYTES)
    outputs[1].set_shared_memory("out", NBYTES, offset=NBYTES)
    for _ in range(20):  # regions serve many requests
        result = httpc.infer("simple", inputs, outputs=outputs)
        # No bytes in the response, exactly as Triton answers (tritonclient users read the region).
        assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
        np.testing.assert_array_equal(shm.get_contents_as_numpy(outs, np.int32, [1, 16]), a + b)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(outs, np.int32, [1, 16], offset=NBYTES), a - b)
    maps = worker_maps(shm_server).splitlines()
    # The worker read the client's segment in place, mapped read-only; only the output region is writable.
    assert {ln.split()[1] for ln in maps if key_of(ins).lstrip("/") in ln} == {"r--s"}
    assert {ln.split()[1] for ln in maps if key_of(outs).lstrip("/") in ln} == {"rw-s"}

    httpc.unregister_system_shared_memory("in")
    assert [r["name"] for r in httpc.get_system_shared_memory_status()] == ["out"]
    # Unregister tells the workers to unmap: no mapping outlives its registration.
    eventually(lambda: key_of(ins).lstrip("/") not in worker_maps(shm_server), timeout=15.0, interval=0.1)


def test_grpc_mixed_placement(grpc: tg.InferenceServerClient, regions: Any) -> None:
    """One input in shm, one inline; one output in shm, one returned."""
    a, b = operands()
    ins, outs = regions("gin", NBYTES), regions("gout", NBYTES)
    shm.set_shared_memory_region(ins, [a])
    grpc.register_system_shared_memory("gin", key_of(ins), NBYTES)
    grpc.register_system_shared_memory("gout", key_of(outs), NBYTES)
    regs = grpc.get_system_shared_memory_status().regions
    assert regs["gin"].key == key_of(ins) and regs["gin"].byte_size == NBYTES

    x0 = tg.InferInput("INPUT0", [1, 16], "INT32")
    x0.set_shared_memory("gin", NBYTES)
    x1 = tg.InferInput("INPUT1", [1, 16], "INT32").set_data_from_numpy(b)
    o0 = tg.InferRequestedOutput("OUTPUT0")
    o0.set_shared_memory("gout", NBYTES)
    o1 = tg.InferRequestedOutput("OUTPUT1")
    result = grpc.infer("simple", [x0, x1], outputs=[o0, o1])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outs, np.int32, [1, 16]), a + b)
    assert result.get_response().raw_output_contents[0] == b""  # as Triton: the shm output keeps its slot


def test_large_tensor_response_carries_no_bytes(shm_server: Server, httpc: th.InferenceServerClient,
                                                regions: Any) -> None:
    """Zero copy on the way out: 1 MiB lands in the client's segment, the response is a few hundred bytes."""
    data = np.random.default_rng(0).random(1 << 18, dtype=np.float32)
    ins, outs = regions("big_in", data.nbytes), regions("big_out", data.nbytes)
    shm.set_shared_memory_region(ins, [data])
    httpc.register_system_shared_memory("big_in", key_of(ins), data.nbytes)
    httpc.register_system_shared_memory("big_out", key_of(outs), data.nbytes)
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [data.size],
                    "parameters": {"shared_memory_region": "big_in", "shared_memory_byte_size": data.nbytes}}],
        "outputs": [{"name": "OUTPUT0",
                     "parameters": {"shared_memory_region": "big_out", "shared_memory_byte_size": data.nbytes}}],
    }
    status, raw = call(shm_server, "POST", "/v2/models/identity_fp32/infer", body)
    assert status == 200, raw
    assert len(raw) < 512
    assert json.loads(raw)["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [data.size]}]
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outs, np.float32, [data.size]), data)


# --- bad input: the protocol's error, and the server carries on ----------------------------


def call(srv: Server, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def http_error(srv: Server, method: str, path: str, body: Any = None) -> tuple[int, str]:
    status, data = call(srv, method, path, body)
    return status, json.loads(data)["error"] if status != 200 else ""


def test_registration_errors(shm_server: Server, httpc: th.InferenceServerClient, regions: Any) -> None:
    seg = regions("r", 64)
    register = "/v2/systemsharedmemory/region/{}/register"
    httpc.register_system_shared_memory("r", key_of(seg), 64)
    cases = [
        ("r", {"key": key_of(seg), "offset": 0, "byte_size": 64}, 400, "already in manager"),
        ("x", {"key": "/cv_no_such_segment", "offset": 0, "byte_size": 64}, 500,  # Triton's INTERNAL
         "Unable to open shared memory region: '/cv_no_such_segment'"),
        ("y", {"key": key_of(seg), "offset": 0, "byte_size": 1 << 20}, 400,
         "failed to register shared memory region 'y': invalid args"),
        ("y", {"key": key_of(seg), "offset": 60, "byte_size": 8}, 400,
         "failed to register shared memory region 'y': invalid args"),
        ("z", {"key": key_of(seg)}, 400, "no 'byte_size' field"),
        ("z", {"key": key_of(seg), "byte_size": -1}, 400, "'byte_size' must be a non-negative integer"),
    ]
    for name, body, status, message in cases:
        got = http_error(shm_server, "POST", register.format(name), body)
        assert got[0] == status and message in got[1], (body, got)
    assert http_error(shm_server, "GET", "/v2/systemsharedmemory/region/nope/status") == (
        404, "Unable to find system shared memory region: 'nope'")
    assert http_error(shm_server, "POST", "/v2/systemsharedmemory/region/nope/unregister") == (200, "")
    assert [r["name"] for r in httpc.get_system_shared_memory_status()] == ["r"]


def test_grpc_registration_errors(grpc: tg.InferenceServerClient, regions: Any) -> None:
    seg = regions("gr", 64)
    grpc.register_system_shared_memory("gr", key_of(seg), 64)
    for args, code in [
        (("gr", key_of(seg), 64), "StatusCode.ALREADY_EXISTS"),
        (("gx", "/cv_no_such_segment", 64), "StatusCode.INTERNAL"),
        (("gy", key_of(seg), 1 << 20), "StatusCode.INVALID_ARGUMENT"),
    ]:
        with pytest.raises(InferenceServerException) as err:
            grpc.register_system_shared_memory(*args)
        assert err.value.status() == code, (args, err.value)


def test_request_errors(shm_server: Server, httpc: th.InferenceServerClient, grpc: tg.InferenceServerClient,
                        regions: Any) -> None:
    a, b = operands()
    seg = regions("e", NBYTES)
    shm.set_shared_memory_region(seg, [a])
    httpc.register_system_shared_memory("e", key_of(seg), NBYTES)

    def body(region: str, size: int, offset: int = 0, out_size: int | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {"inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {
                "shared_memory_region": region, "shared_memory_byte_size": size, "shared_memory_offset": offset}},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": b.ravel().tolist()},
        ]}
        if out_size is not None:
            doc["outputs"] = [{"name": "OUTPUT0", "parameters": {
                "shared_memory_region": "e", "shared_memory_byte_size": out_size}}]
        return doc

    infer = "/v2/models/simple/infer"
    cases = [
        (body("nope", NBYTES), 404, "Unable to find shared memory region: 'nope'"),
        (body("e", NBYTES, offset=8), 400, "Invalid offset + byte size for shared memory region: 'e'"),
        (body("e", NBYTES - 4), 400, "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64"),
        (body("e", NBYTES, out_size=8), 400,
         "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should be at least 64"),
    ]
    for doc, status, message in cases:
        got = http_error(shm_server, "POST", infer, doc)
        assert got[0] == status and message in got[1], got

    x0 = tg.InferInput("INPUT0", [1, 16], "INT32")
    x0.set_shared_memory("nope", NBYTES)
    x1 = tg.InferInput("INPUT1", [1, 16], "INT32").set_data_from_numpy(b)
    with pytest.raises(InferenceServerException) as err:
        grpc.infer("simple", [x0, x1])
    assert err.value.status() == "StatusCode.NOT_FOUND"

    # The server is fine and the region still works.
    ok = http_error(shm_server, "POST", infer, body("e", NBYTES))
    assert ok == (200, "")
    assert httpc.is_server_ready()
    # Once unregistered, no worker keeps a mapping of any test segment.
    httpc.unregister_system_shared_memory()
    try:
        eventually(lambda: "cv_test_" not in worker_maps(shm_server), timeout=15.0, interval=0.1)
    except AssertionError:
        raise AssertionError([ln for ln in worker_maps(shm_server).splitlines() if "cv_test_" in ln]) from None


@pytest.mark.skipif(os.geteuid() == 0, reason="root opens any segment: permissions cannot be tested as root")
def test_segment_the_server_may_not_open(shm_server: Server, regions: Any) -> None:
    seg = regions("private", 64)
    os.fchmod(seg._shm_fd, 0) if hasattr(seg, "_shm_fd") else os.chmod(f"/dev/shm/{key_of(seg).lstrip('/')}", 0)
    status, message = http_error(shm_server, "POST", "/v2/systemsharedmemory/region/private/register",
                                 {"key": key_of(seg), "offset": 0, "byte_size": 64})
    assert (status, message) == (500, f"Unable to open shared memory region: '{key_of(seg)}'")


def test_client_that_dies_without_unregistering(shm_server: Server, httpc: th.InferenceServerClient,
                                                regions: Any) -> None:
    a, b = operands()
    seg = regions("gone", NBYTES)
    shm.set_shared_memory_region(seg, [a])
    httpc.register_system_shared_memory("gone", key_of(seg), NBYTES)
    x0 = th.InferInput("INPUT0", [1, 16], "INT32")
    x0.set_shared_memory("gone", NBYTES)
    x1 = th.InferInput("INPUT1", [1, 16], "INT32")
    x1.set_data_from_numpy(b)
    httpc.infer("simple", [x0, x1])
    posix_ipc.unlink_shared_memory(key_of(seg))  # what a dead client's cleanup (or the OS) leaves
    # The router notices the segment is gone, drops the region and the worker unmaps it.
    eventually(lambda: httpc.get_system_shared_memory_status() == [], timeout=15.0, interval=0.1)
    eventually(lambda: key_of(seg).lstrip("/") not in worker_maps(shm_server), timeout=15.0, interval=0.1)
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region: 'gone'"):
        httpc.infer("simple", [x0, x1])


def test_unregister_while_requests_run(shm_server: Server, regions: Any) -> None:
    """Each request either completes correctly or fails with a clear error; none hangs."""
    a, b = operands()
    seg = regions("busy", NBYTES)
    shm.set_shared_memory_region(seg, [a])
    client = th.InferenceServerClient(shm_server.http_url)
    client.register_system_shared_memory("busy", key_of(seg), NBYTES)
    x0 = th.InferInput("INPUT0", [1, 16], "INT32")
    x0.set_shared_memory("busy", NBYTES)
    x1 = th.InferInput("INPUT1", [1, 16], "INT32")
    x1.set_data_from_numpy(b)
    outcomes: list[str] = []
    stop = threading.Event()

    def load() -> None:
        mine = th.InferenceServerClient(shm_server.http_url)  # gevent clients are per thread
        while not stop.is_set():
            try:
                got = mine.infer("simple", [x0, x1]).as_numpy("OUTPUT0")
                outcomes.append("ok" if np.array_equal(got, a + b) else "WRONG")
            except InferenceServerException as exc:
                outcomes.append(str(exc.message()))
        mine.close()

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    client.unregister_system_shared_memory("busy")
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join(30)
    client.close()
    assert "WRONG" not in outcomes
    assert outcomes.count("ok") > 0
    assert all(o == "ok" or "shared memory region" in o for o in outcomes), set(outcomes)


# --- CUDA without a GPU, and the default-off server ---------------------------------------------


def test_cuda_shared_memory_without_a_gpu(shm_server: Server, grpc: tg.InferenceServerClient) -> None:
    import base64

    httpc = th.InferenceServerClient(shm_server.http_url)
    assert httpc.get_cuda_shared_memory_status() == []
    httpc.unregister_cuda_shared_memory()
    assert list(grpc.get_cuda_shared_memory_status().regions) == []
    grpc.unregister_cuda_shared_memory()
    with pytest.raises(InferenceServerException, match="CUDA shared memory is unavailable"):
        httpc.register_cuda_shared_memory("c", base64.b64encode(b"\0" * 64), 0, 64)
    with pytest.raises(InferenceServerException, match="CUDA shared memory is unavailable") as err:
        grpc.register_cuda_shared_memory("c", base64.b64encode(b"\0" * 64), 0, 64)
    assert err.value.status() == "StatusCode.UNIMPLEMENTED"


def test_client_shm_is_off_by_default(server: Server, regions: Any) -> None:
    seg = regions("off", 64)
    client = th.InferenceServerClient(server.http_url)
    assert client.get_system_shared_memory_status() == []
    disabled = ("501", "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.")
    with pytest.raises(InferenceServerException) as err:
        client.register_system_shared_memory("off", key_of(seg), 64)
    assert (err.value.status(), err.value.message()) == disabled
    with pytest.raises(InferenceServerException) as err:  # as Triton: status is allowed, unregister is not
        client.unregister_system_shared_memory()
    assert (err.value.status(), err.value.message()) == disabled
    meta = client.get_server_metadata()
    assert "system_shared_memory" in meta["extensions"]


def test_python_model_reads_and_writes_client_shm(grpc: tg.InferenceServerClient, regions: Any) -> None:
    """A Triton model.py gets its input from, and its output lands in, the client's region."""
    x = np.linspace(0, 1, 32, dtype=np.float32).reshape(1, 32)
    ins, outs = regions("pin", x.nbytes), regions("pout", x.nbytes)
    shm.set_shared_memory_region(ins, [x])
    grpc.register_system_shared_memory("pin", key_of(ins), x.nbytes)
    grpc.register_system_shared_memory("pout", key_of(outs), x.nbytes)
    inp = tg.InferInput("INPUT0", [1, 32], "FP32")
    inp.set_shared_memory("pin", x.nbytes)
    out = tg.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("pout", x.nbytes)
    grpc.infer("py_identity", [inp], outputs=[out])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(outs, np.float32, [1, 32]), x)
