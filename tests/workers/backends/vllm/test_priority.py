"""The engine processes' CPU priority (``ENGINE_NICE``) and placement (``ENGINE_CPUS``), on real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from conveyor.proto.errors import ConveyorError, Status
from conveyor.workers.backends.vllm import placement, priority
from conveyor.workers.backends.vllm.engine import own_processes

LEVEL = "e2e"


def test_auto_lowers_the_engine_only_on_a_small_host() -> None:
    small = len(os.sched_getaffinity(0)) < priority.AUTO_MIN_CORES
    assert priority.engine_nice(None) == priority.engine_nice("auto") == (priority.AUTO_NICE if small else 0)
    assert priority.engine_nice(" 5 ") == 5
    assert priority.engine_nice("0") == 0


@pytest.mark.parametrize("bad", ["-5", "20", "low"])
def test_a_bad_setting_fails_the_load_clearly(bad: str) -> None:
    with pytest.raises(ConveyorError) as err:
        priority.engine_nice(bad)
    assert err.value.status is Status.UNAVAILABLE and "ENGINE_NICE" in err.value.message


def test_every_thread_of_the_new_processes_is_lowered_and_nothing_else() -> None:
    before = priority.descendants()
    # A child with a second thread, and a grandchild: as the engine core and its model worker.
    code = ("import subprocess, sys, threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code])
    new: set[int] = set()
    try:
        deadline = time.monotonic() + 10
        while len(priority.descendants() - before) < 2 or len(os.listdir(f"/proc/{child.pid}/task")) < 2:
            assert time.monotonic() < deadline, "the child did not start its thread and grandchild"
            time.sleep(0.05)
        new = priority.descendants() - before
        assert child.pid in new and len(new) == 2
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert priority.lower_priority(new, 7) == 3  # two threads of the child, one of the grandchild
        for pid in new:
            for tid in os.listdir(f"/proc/{pid}/task"):
                assert os.getpriority(os.PRIO_PROCESS, int(tid)) == min(19, own + 7)
        assert os.getpriority(os.PRIO_PROCESS, 0) == own  # this process keeps its own
    finally:
        for pid in new - {child.pid}:  # the grandchild
            os.kill(pid, signal.SIGKILL)
        child.kill()
        child.wait()


def test_the_engine_core_joins_its_model_on_a_small_host_unless_told() -> None:
    """``ENGINE_CPUS``: "auto" keeps the engine core on the compute cores only where the host is
    small; "compute" and "free" say so everywhere; anything else fails the load clearly."""
    small = len(os.sched_getaffinity(0)) < priority.AUTO_MIN_CORES
    assert placement.engine_on_compute_cores(None) is placement.engine_on_compute_cores(" Auto ") is small
    assert placement.engine_on_compute_cores("compute") is True
    assert placement.engine_on_compute_cores("free") is False
    with pytest.raises(ConveyorError) as err:
        placement.engine_on_compute_cores("gpu")
    assert err.value.status is Status.UNAVAILABLE and "ENGINE_CPUS" in err.value.message


def test_an_engine_claims_only_its_own_processes_when_two_start_at_once() -> None:
    """Two engines loading at once in one worker: what appeared below the worker while one started holds
    the other's processes too. Each engine takes its engine core (as vLLM's process manager knows it)
    and what is below it, so that neither re-nices, confines or unlinks the other's."""
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); " \
           "time.sleep(30)"
    before = priority.descendants()
    cores = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]  # each with its model worker
    try:
        deadline = time.monotonic() + 10
        while len(priority.descendants() - before) < 4:
            assert time.monotonic() < deadline, "the children did not start theirs"
            time.sleep(0.05)
        new = priority.descendants() - before
        manager = SimpleNamespace(processes=[cores[0]])
        engine = SimpleNamespace(engine_core=SimpleNamespace(resources=SimpleNamespace(engine_manager=manager)))
        own, compute = own_processes(engine, new)
        assert compute == priority.descendants(cores[0].pid) and len(compute) == 1  # its model worker
        assert own == {cores[0].pid, *compute}
        assert own_processes(SimpleNamespace(), new) == (new, new)  # vLLM in this process: no manager to ask
    finally:
        for core in cores:
            for pid in priority.descendants(core.pid):
                os.kill(pid, signal.SIGKILL)
            core.kill()
            core.wait()
