import os
import threading

import pytest

from conveyor.proto import dispatch_cpu as dc


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
