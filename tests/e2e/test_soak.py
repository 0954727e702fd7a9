"""A bounded soak: every kind of client at once against the real process group
while a chaos thread SIGKILLs a worker every few seconds.

Clients: HTTP and gRPC (one tritonclient object per thread), a client whose
inputs and outputs live in its own system shared memory, sequences on an
accumulator, and a dynamic-batching model. Each checks every answer against
numpy. Afterwards: no wrong answer, only retryable errors (503 / UNAVAILABLE)
and only once the kills began, broken sequences get the documented "was lost"
error and start again cleanly, the router's and each ingress's memory stayed
bounded, /dev/shm holds only live segments, and the statistics add up.

``CONVEYOR_SOAK_SECONDS`` (default 15) sets how long the clients run;
``CONVEYOR_SOAK_KILL_EVERY`` (default 4) the seconds between kills. Run it
alone, longer: ``CONVEYOR_SOAK_SECONDS=600 pytest -m soak -s --timeout 0``.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import add_sub
from conveyor.deploy.runtime.procs import actor_role, children
from conveyor.shm.naming import owner_pid
from tests.support import soak_report
from tests.support.group import Server, start_server, wait_all_instances_ready
from tests.support.sequence_models import accumulator
from tests.support.waiting import eventually

LEVEL = "e2e"

SOAK_S = float(os.environ.get("CONVEYOR_SOAK_SECONDS", "15"))
KILL_EVERY_S = float(os.environ.get("CONVEYOR_SOAK_KILL_EVERY", "3"))
WAIT_S = 60.0  # any single wait; only reached when something is broken
REQUEST_S = 20.0  # a request unanswered this long counts as hung
NBYTES = 16 * 4  # one INT32 [1, 16] tensor

pytestmark = [pytest.mark.soak, pytest.mark.timeout(int(SOAK_S) + 240)]

LOST = "was lost when the instance running it went away; start it again with the START flag"


def is_retryable(exc: InferenceServerException) -> bool:
    return exc.status() in ("503", "StatusCode.UNAVAILABLE")


@dataclass
class Tally:
    """What one kind of client saw."""

    ok: int = 0
    wrong: list[str] = field(default_factory=list)
    retryable: int = 0
    other: list[str] = field(default_factory=list)  # errors of a kind a kill must not cause
    before_kills: list[str] = field(default_factory=list)  # retryable errors before any kill
    hung: int = 0  # requests the client gave up on after REQUEST_S (no answer at all)
    lost_seen: int = 0  # sequences: "was lost" answers to the probe after a broken step
    restarted: int = 0  # sequences: started again after a kill and ran to END right
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Soak:
    server: Server
    stop: threading.Event = field(default_factory=threading.Event)
    first_kill: float | None = None
    kills: int = 0
    tallies: dict[str, Tally] = field(default_factory=dict)
    ok_by_model: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tally(self, kind: str) -> Tally:
        with self.lock:
            return self.tallies.setdefault(kind, Tally())

    def call(self, kind: str, model: str, request: Callable[[], Any], check: Callable[[Any], str | None]) -> bool:
        """One request: counts it under ``kind``; True when it answered right."""
        t = self.tally(kind)
        try:
            result = request()
        except (TimeoutError, OSError) as exc:  # the HTTP client's own timeout: no answer came
            with t.lock:
                t.hung += 1
            log_hang(kind, exc)
            return False
        except InferenceServerException as exc:
            with t.lock:
                if exc.status() == "StatusCode.DEADLINE_EXCEEDED":
                    t.hung += 1
                    log_hang(kind, exc)
                elif not is_retryable(exc):
                    t.other.append(f"{exc.status()}: {exc.message()}")
                elif self.first_kill is None:
                    t.before_kills.append(f"{exc.status()}: {exc.message()}")
                else:
                    t.retryable += 1
            return False
        wrong = check(result)
        with t.lock:
            if wrong:
                t.wrong.append(wrong)
                return False
            t.ok += 1
        with self.lock:
            self.ok_by_model[model] += 1
        return True


def log_hang(kind: str, exc: BaseException) -> None:
    print(f"soak {kind}: no answer in {REQUEST_S:.0f}s ({type(exc).__name__}: {exc})", flush=True)


def soak_repository(repo: str) -> None:
    add_sub(repo, "plain", 8)  # one instance on each worker, no batching
    add_sub(repo, "batched", 8, "dynamic_batching { max_queue_delay_microseconds: 2000 }")
    accumulator(repo, "seq", "direct { }", instances=0)  # one instance (4 slots) on each worker


@pytest.fixture(scope="module")
def soak_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("soak"))
    soak_repository(repo)
    srv = start_server(repo, f"k{os.getpid()}", "--workers", "2", "--allow-client-shm", "true")
    for model in ("plain", "batched", "seq"):
        wait_all_instances_ready(srv.group, model, 2)
    yield srv
    assert srv.stop() == 0
    assert srv.shm_segments() == []


def operands(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return (rng.integers(-1000, 1000, (1, 16), dtype=np.int32), rng.integers(-1000, 1000, (1, 16), dtype=np.int32))


def add_sub_check(a: np.ndarray, b: np.ndarray) -> Callable[[Any], str | None]:
    def check(result: Any) -> str | None:
        if not np.array_equal(result.as_numpy("OUTPUT0"), a + b) or not np.array_equal(
                result.as_numpy("OUTPUT1"), a - b):
            return f"add_sub: {a.tolist()} {b.tolist()} -> {result.as_numpy('OUTPUT0')}"
        return None
    return check


# --- the clients -------------------------------------------------------------------------------


def http_client(soak: Soak, kind: str, model: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    client = th.InferenceServerClient(soak.server.http_url, network_timeout=REQUEST_S)
    try:
        while not soak.stop.is_set():
            a, b = operands(rng)
            inputs = [th.InferInput("INPUT0", [1, 16], "INT32"), th.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_data_from_numpy(a, binary_data=bool(seed % 2))
            inputs[1].set_data_from_numpy(b, binary_data=True)
            soak.call(kind, model, partial(client.infer, model, inputs), add_sub_check(a, b))
    finally:
        client.close()


def grpc_client(soak: Soak, kind: str, model: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    client = tg.InferenceServerClient(soak.server.grpc_url)
    try:
        while not soak.stop.is_set():
            a, b = operands(rng)
            inputs = [tg.InferInput("INPUT0", [1, 16], "INT32"), tg.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            soak.call(kind, model, partial(client.infer, model, inputs, client_timeout=REQUEST_S), add_sub_check(a, b))
    finally:
        client.close()


def shm_client(soak: Soak, regions: dict[str, Any], seed: int) -> None:
    """Inputs and outputs in the client's own segments, registered once for the whole soak."""
    rng = np.random.default_rng(seed)
    ins, outs = regions["in"], regions["out"]
    client = th.InferenceServerClient(soak.server.http_url, network_timeout=REQUEST_S)
    inputs = [th.InferInput("INPUT0", [1, 16], "INT32"), th.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("soak_in", NBYTES)
    inputs[1].set_shared_memory("soak_in", NBYTES, offset=NBYTES)
    outputs = [th.InferRequestedOutput("OUTPUT0"), th.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("soak_out", NBYTES)
    outputs[1].set_shared_memory("soak_out", NBYTES, offset=NBYTES)
    try:
        while not soak.stop.is_set():
            a, b = operands(rng)  # fresh operands: a stale output cannot pass for a right one
            shm.set_shared_memory_region(ins, [a, b])

            def check(_result: Any, a: np.ndarray = a, b: np.ndarray = b) -> str | None:
                got0 = shm.get_contents_as_numpy(outs, np.int32, [1, 16])
                got1 = shm.get_contents_as_numpy(outs, np.int32, [1, 16], offset=NBYTES)
                if not np.array_equal(got0, a + b) or not np.array_equal(got1, a - b):
                    return f"shm: {a.tolist()} {b.tolist()} -> {got0.tolist()}"
                return None

            soak.call("shm", "plain", partial(client.infer, "plain", inputs, outputs=outputs), check)
    finally:
        client.close()


def sequence_client(soak: Soak, first_id: int, seed: int) -> None:
    """Sequences of 2 to 8 steps on the accumulator, alternating HTTP and gRPC. A step
    that fails (its instance went away) breaks the sequence: a further step without
    START must get the "was lost" error, and the sequence then starts again."""
    rng = random.Random(seed)
    hc = th.InferenceServerClient(soak.server.http_url, network_timeout=REQUEST_S)
    gc = tg.InferenceServerClient(soak.server.grpc_url)
    t = soak.tally("sequence")
    sid = first_id

    def step(value: int, start: bool, end: bool, use_grpc: bool) -> Any:
        if use_grpc:
            gi = tg.InferInput("INPUT", [1, 1], "INT32")
            gi.set_data_from_numpy(np.array([[value]], np.int32))
            return gc.infer("seq", [gi], sequence_id=sid, sequence_start=start, sequence_end=end,
                            client_timeout=REQUEST_S)
        hi = th.InferInput("INPUT", [1, 1], "INT32").set_data_from_numpy(np.array([[value]], np.int32))
        return hc.infer("seq", [hi], sequence_id=sid, sequence_start=start, sequence_end=end)

    try:
        broken = False  # the previous sequence under this id broke: this one is its restart
        while not soak.stop.is_set():
            values = [rng.randint(1, 100) for _ in range(rng.randint(2, 8))]
            total = 0
            for i, value in enumerate(values):
                total += value
                end = i == len(values) - 1

                def check(result: Any, want: int = total) -> str | None:
                    got = int(result.as_numpy("OUTPUT").reshape(-1)[0])
                    return None if got == want else f"sequence: want {want}, got {got}"

                if not soak.call("sequence", "seq", lambda v=value, s=i == 0, e=end: step(v, s, e, rng.random() < .5),  # type: ignore[misc]
                                 check):
                    if not end:
                        probe(soak, t, lambda: step(1, False, False, rng.random() < .5))
                    broken = True
                    break
            else:
                if broken:
                    with t.lock:
                        t.restarted += 1
                broken = False
                sid += 1  # a fresh id for the next sequence
    finally:
        hc.close()
        gc.close()


def probe(soak: Soak, t: Tally, request: Callable[[], Any]) -> None:
    """The step after a broken one, without START: the documented "was lost" error."""
    try:
        request()
    except InferenceServerException as exc:
        with t.lock:
            if is_retryable(exc) and LOST in exc.message():
                t.lost_seen += 1
            else:
                t.other.append(f"probe after a broken step: {exc.status()}: {exc.message()}")
        return
    with t.lock:
        t.wrong.append("a step without START after a broken one was answered")


# --- chaos and measurements --------------------------------------------------------------------


def role_pids(server: Server) -> dict[int, str]:
    return {pid: actor_role(argv) for pid, argv in children(server.proc.pid).items()}


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def chaos(soak: Soak, seed: int) -> None:
    """SIGKILL one worker every KILL_EVERY_S, once the group has its two workers serving again."""
    rng = random.Random(seed)
    while not soak.stop.wait(KILL_EVERY_S):
        for model in ("plain", "batched", "seq"):
            wait_all_instances_ready(soak.server.group, model, 2, timeout=WAIT_S)
        if soak.stop.is_set():
            return
        workers = sorted(p for p, role in role_pids(soak.server).items() if role == "worker")
        victim = rng.choice(workers)
        if soak.first_kill is None:
            soak.first_kill = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        soak.kills += 1


def live_segments_only(server: Server) -> bool:
    live = set(role_pids(server))
    return all(owner_pid(name) in live for name in server.shm_segments())


def model_successes(server: Server) -> dict[str, int]:
    client = th.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics()["model_stats"]
    finally:
        client.close()
    return {s["name"]: int(s["inference_stats"]["success"]["count"]) for s in stats}


def test_soak_under_worker_kills(soak_server: Server) -> None:
    srv = soak_server
    tag = f"{os.getpid()}_{time.monotonic_ns()}"
    regions = {
        "in": shm.create_shared_memory_region("soak_in", f"/cv_soak_in_{tag}", 2 * NBYTES),
        "out": shm.create_shared_memory_region("soak_out", f"/cv_soak_out_{tag}", 2 * NBYTES),
    }
    admin = th.InferenceServerClient(srv.http_url)
    admin.register_system_shared_memory("soak_in", f"/cv_soak_in_{tag}", 2 * NBYTES)
    admin.register_system_shared_memory("soak_out", f"/cv_soak_out_{tag}", 2 * NBYTES)
    soak = Soak(srv)
    clients: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
        (http_client, (soak, "http", "plain", 1)), (http_client, (soak, "http", "plain", 2)),
        (grpc_client, (soak, "grpc", "plain", 3)), (grpc_client, (soak, "grpc", "plain", 4)),
        (shm_client, (soak, regions, 5)),
        (sequence_client, (soak, 1_000_000, 6)), (sequence_client, (soak, 2_000_000, 7)),
        (http_client, (soak, "batched", "batched", 8)), (grpc_client, (soak, "batched", "batched", 9)),
        (http_client, (soak, "batched", "batched", 10)),
    ]
    threads = [threading.Thread(target=fn, args=args, daemon=True) for fn, args in clients]
    killer = threading.Thread(target=chaos, args=(soak, 11), daemon=True)
    try:
        before = successes_before = None
        for th_ in threads:
            th_.start()
        # Warm-up: every kind of client has had answers; then the memory baseline.
        eventually(lambda: all(soak.tally(k).ok >= 20 for k in ("http", "grpc", "shm", "sequence", "batched")),
                   WAIT_S, what="the clients did not get going")
        watched = {pid: role for pid, role in role_pids(srv).items() if role == "router" or role.startswith("ingress")}
        before = {pid: rss_kib(pid) for pid in watched}
        successes_before = model_successes(srv)
        killer.start()
        time.sleep(SOAK_S)
    finally:
        soak.stop.set()
        for th_ in threads:
            th_.join(WAIT_S + 30)
        if killer.ident is not None:
            killer.join(WAIT_S + 30)
        assert not any(th_.is_alive() for th_ in threads), "a client hung"
    assert before is not None and successes_before is not None

    # The group settles: both workers serve again, and afterwards every kind of request is answered.
    for model in ("plain", "batched", "seq"):
        wait_all_instances_ready(srv.group, model, 2)
    settled = Soak(srv)
    settled.first_kill = time.monotonic()  # so that an error here is counted, not excused
    rng = np.random.default_rng(99)
    hc, gc = th.InferenceServerClient(srv.http_url), tg.InferenceServerClient(srv.grpc_url)
    for model in ("plain", "batched"):
        a, b = operands(rng)
        hi = [th.InferInput("INPUT0", [1, 16], "INT32"), th.InferInput("INPUT1", [1, 16], "INT32")]
        hi[0].set_data_from_numpy(a)
        hi[1].set_data_from_numpy(b)
        assert settled.call("after", model, partial(hc.infer, model, hi), add_sub_check(a, b))
        gi = [tg.InferInput("INPUT0", [1, 16], "INT32"), tg.InferInput("INPUT1", [1, 16], "INT32")]
        gi[0].set_data_from_numpy(a)
        gi[1].set_data_from_numpy(b)
        assert settled.call("after", model, partial(gc.infer, model, gi), add_sub_check(a, b))
    hc.close()
    gc.close()

    # Memory of the long-lived processes: bounded after warm-up.
    after = {pid: rss_kib(pid) for pid in watched}
    assert set(watched) <= set(role_pids(srv)), "the router or an ingress restarted during the soak"

    # Shared memory: the group's live segments and our two regions, nothing of a dead worker.
    eventually(lambda: live_segments_only(srv), WAIT_S, what=f"orphaned segments: {srv.shm_segments()}")
    assert {f"cv_soak_in_{tag}", f"cv_soak_out_{tag}"} <= set(os.listdir("/dev/shm"))
    assert {r["name"] for r in admin.get_system_shared_memory_status()} == {"soak_in", "soak_out"}

    # A worker answers the ingress directly and the router counts the success when the worker's
    # copy of the result reaches it: give the last counts a moment to land.
    deadline = time.monotonic() + 10
    successes_after = model_successes(srv)
    while time.monotonic() < deadline and any(successes_after.get(model, 0) < seen
                                              for model, seen in soak.ok_by_model.items()):
        time.sleep(0.2)
        successes_after = model_successes(srv)
    admin.unregister_system_shared_memory()
    admin.close()
    for handle in regions.values():
        shm.destroy_shared_memory_region(handle)

    lines = []
    for kind, t in sorted(soak.tallies.items()):
        extra = f" lost-probes={t.lost_seen} restarted={t.restarted}" if kind == "sequence" else ""
        lines.append(f"soak {kind}: ok={t.ok} wrong={len(t.wrong)} retryable={t.retryable} other={len(t.other)}"
                     f" hung={t.hung} before-kills={len(t.before_kills)}{extra}")
    lines.append(f"soak: {SOAK_S:.0f}s, {soak.kills} worker kills, "
                 f"{sum(t.ok for t in soak.tallies.values())} right answers")
    for pid, role in sorted(watched.items(), key=lambda kv: kv[1]):
        lines.append(f"soak rss {role} {pid}: {before[pid] / 1024:.1f} MiB -> {after[pid] / 1024:.1f} MiB")
    print("\n".join(lines))
    soak_report.LINES.extend(lines)

    for kind, t in soak.tallies.items():
        assert t.wrong == [], f"{kind}: wrong answers {t.wrong[:5]}"
        assert t.other == [], f"{kind}: errors that are not retryable {t.other[:5]}"
        assert t.before_kills == [], f"{kind}: errors before any kill {t.before_kills[:5]}"
        assert t.ok > 0, kind
    hung = sum(t.hung for t in soak.tallies.values())
    assert soak.kills >= 1
    seq = soak.tally("sequence")
    assert seq.lost_seen <= seq.retryable
    for pid, role in watched.items():
        assert after[pid] < 1.5 * before[pid] + 50 * 1024, f"{role} grew: {before[pid]} -> {after[pid]} KiB"
    for model, seen in soak.ok_by_model.items():  # the router counts every success a client saw...
        # ...but one: a worker killed between its direct answer to the ingress and its copy to the
        # router leaves a success the router counted as that batch's failure (ARCHITECTURE.md).
        lost = seen - successes_after[model]
        assert lost <= soak.kills, f"{model}: statistics say {successes_after[model]}, clients saw {seen}"
        assert successes_after[model] >= successes_before[model]
    # Every request is answered: a worker's death fails its batches at once and no batch is
    # ever sent to it afterwards (WorkerMembership.drop marks its instances unusable first).
    assert hung == 0, f"{hung} request(s) got no answer around worker kills"
