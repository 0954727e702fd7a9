import os
import threading
import time

import pytest

from conveyor.deploy.runtime import dispatch_cpu as dc

LEVEL = "e2e"


@pytest.fixture
def cpus(monkeypatch: pytest.MonkeyPatch) -> list[set[int]]:
    """The CPUs the process may use, as ``dispatch_cpu`` sees them: set it in the test."""
    allowed = [{0, 1}]
    monkeypatch.setattr(dc.os, "sched_getaffinity", lambda pid: set(allowed[0]))
    monkeypatch.delenv(dc.DISPATCH_CPU_ENV, raising=False)
    return allowed


def test_auto_pins_on_two_cpus_and_not_on_larger_or_single_cpu_hosts(cpus: list[set[int]]) -> None:
    assert dc.dispatch_cpu() == 1  # the last allowed CPU
    cpus[0] = {2, 5}
    assert dc.dispatch_cpu("auto") == 5
    cpus[0] = set(range(16))
    assert dc.dispatch_cpu("auto") is None  # not measured there yet
    cpus[0] = {0}
    assert dc.dispatch_cpu("auto") is None  # one core: nothing to gain


def test_off_a_cpu_number_and_the_environment(cpus: list[set[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    assert dc.dispatch_cpu("off") is None
    assert dc.dispatch_cpu("0") == 0
    monkeypatch.setenv(dc.DISPATCH_CPU_ENV, "off")
    assert dc.dispatch_cpu() is None
    assert dc.dispatch_cpu("1") == 1  # the flag wins over the environment


def test_bad_settings_are_refused_with_what_is_allowed(cpus: list[set[int]]) -> None:
    with pytest.raises(ValueError, match="'auto', 'off' or a CPU number"):
        dc.dispatch_cpu("fast")
    with pytest.raises(ValueError, match=r"CPU 7 is not one this process may run on \(0, 1\)"):
        dc.dispatch_cpu("7")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_pinned_thread_and_the_model_threads_it_starts() -> None:
    """The pin holds for the thread that asked and the threads it starts; a thread that calls
    ``release_thread`` (a worker's instance thread) gets every CPU back. Run on a thread of its
    own: the pin must not outlive the test on pytest's thread."""
    every = os.sched_getaffinity(0)
    cpu = max(every)
    seen: dict[str, set[int]] = {}

    def child(name: str, release: bool) -> None:
        if release:
            dc.release_thread()
        seen[name] = os.sched_getaffinity(0)

    def dispatcher() -> None:
        dc.pin_dispatch(cpu)
        seen["pinned"] = os.sched_getaffinity(0)
        for name, release in (("inherited", False), ("released", True)):
            t = threading.Thread(target=child, args=(name, release))
            t.start()
            t.join()

    saved = dc._process_cpus
    try:
        t = threading.Thread(target=dispatcher)
        t.start()
        t.join()
    finally:
        dc._process_cpus = saved
    assert seen == {"pinned": {cpu}, "inherited": {cpu}, "released": every}
    assert os.sched_getaffinity(0) == every  # pytest's own thread was never pinned


_ENGINE_NEIGHBOUR = r"""
import json, os, subprocess, sys, threading, time
from conveyor.deploy.runtime import dispatch_cpu as dc

every = os.sched_getaffinity(0)
core = min(every)
# A CPU engine's process: it binds itself to one core, as vLLM's CPU build binds its compute threads.
bind = f"import os, time; os.sched_setaffinity(0, {{{core}}}); time.sleep(60)"
engine = subprocess.Popen([sys.executable, "-c", bind])
free = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # one left on every CPU
try:
    deadline = time.monotonic() + 10
    while os.sched_getaffinity(engine.pid) != {core} and time.monotonic() < deadline:
        time.sleep(0.01)
    out = {"bound": sorted(dc.bound_cpus({engine.pid, free.pid}))}
    stop = threading.Event()
    before = threading.Thread(target=stop.wait)
    before.start()
    saved = dc.avoid_cpus({core})
    out["threads"] = sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")})
    seen = {}
    later = threading.Thread(target=lambda: seen.update(later=sorted(os.sched_getaffinity(0))))
    later.start(); later.join()
    out["later"] = seen["later"]
    dc.share_cpus(saved)
    out["shared"] = sorted({tuple(sorted(os.sched_getaffinity(t))) for t in (0, before.native_id)})
    out["nothing_to_avoid"] = dc.avoid_cpus({max(every) + 1}) is None and dc.avoid_cpus(every) is None
    stop.set(); before.join()
    print(json.dumps(out))
finally:
    engine.kill(); free.kill()
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_worker_keeps_off_the_cores_a_cpu_engine_computes_on() -> None:
    """``bound_cpus`` finds the core an engine's process bound itself to (not the CPUs of a process
    left free); ``avoid_cpus`` moves every thread off it, threads started later too, and
    ``share_cpus`` gives the threads it moved back. In a process of its own: it moves every thread
    of its process."""
    import json
    import subprocess
    import sys

    every = sorted(os.sched_getaffinity(0))
    done = subprocess.run([sys.executable, "-c", _ENGINE_NEIGHBOUR], capture_output=True, text=True, timeout=60,
                          check=True)
    out = json.loads(done.stdout)
    assert out["bound"] == [every[0]]
    assert out["threads"] == [every[1:]] and out["later"] == every[1:]
    assert out["shared"] == [every]
    assert out["nothing_to_avoid"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_confine_keeps_a_free_process_on_the_cores_its_neighbour_computes_on() -> None:
    """``confine`` moves every thread of a process left free (as vLLM's engine core) onto the given
    cores, leaves one already there alone, and the threads it starts afterwards inherit the cores."""
    import subprocess
    import sys

    every = sorted(os.sched_getaffinity(0))
    core = {every[0]}
    # A child with a second thread now, and a third once told (a line on stdin): its affinity then.
    code = ("import os, sys, threading, time; threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); "
            "sys.stdin.readline(); out = []; t = threading.Thread(target=lambda: out.append(os.sched_getaffinity(0)));"
            " t.start(); t.join(); print(sorted(out[0]), flush=True)")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{child.pid}/task")) < 2:
            assert time.monotonic() < deadline, "the child did not start its thread"
            time.sleep(0.05)
        assert dc.confine({child.pid}, core) == 2
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert all(os.sched_getaffinity(t) == core for t in tids)
        assert dc.confine({child.pid}, core) == 0  # already there: nothing moves
        assert os.sched_getaffinity(0) == set(every)  # this process keeps its own
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == str(sorted(core))
    finally:
        child.kill()
        child.wait()


def test_an_engine_that_stops_gives_back_only_what_no_other_engine_computes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two CPU engines of one worker on a 4-core host, each bound to a core of its own: the worker's
    threads keep off both; when the first stops they get its core back, not the second's, and every
    core once both have stopped. The pinned dispatch thread keeps its core throughout. (The affinity
    calls are faked: a 2-core host has no room for two engines and the worker.)"""
    threads = {1: {0, 1, 2, 3}, 2: {3}}  # an instance thread, the pinned main thread
    monkeypatch.setattr(dc, "_threads", lambda pid=None: list(threads))
    monkeypatch.setattr(dc.os, "sched_getaffinity", lambda tid: set(threads[tid or 1]))
    monkeypatch.setattr(dc.os, "sched_setaffinity", lambda tid, cpus: threads.__setitem__(tid or 1, set(cpus)))
    monkeypatch.setattr(dc, "_process_cpus", {0, 1, 2, 3})  # pinned: instance threads started later get these

    first, second = dc.avoid_cpus({0}), dc.avoid_cpus({1})
    assert first is not None and second is not None
    assert threads == {1: {2, 3}, 2: {3}} and dc._process_cpus == {2, 3}
    dc.share_cpus(first)
    assert threads == {1: {0, 2, 3}, 2: {3}} and dc._process_cpus == {0, 2, 3}
    dc.share_cpus(second)
    assert threads == {1: {0, 1, 2, 3}, 2: {3}} and dc._process_cpus == {0, 1, 2, 3}
    assert dc._avoiding == [] and dc._unmoved == {}
