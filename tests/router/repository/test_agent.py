"""The repository agent (router/repository/agent.py): work runs on its lanes' threads, its
outcomes (values or exceptions) come back to the caller of ``drain`` in arrival order, and the
load lane runs as many preparations at once as --model-load-thread-count says."""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Iterator

import pytest

from conveyor.router.repository.agent import Lane, RepositoryAgent

LEVEL = "unit"


@pytest.fixture
def agent() -> Iterator[RepositoryAgent]:
    a = RepositoryAgent(load_threads=2)
    yield a
    a.close()


def test_outcomes_come_back_on_the_loop(agent: RepositoryAgent) -> None:
    loop = threading.get_ident()
    seen: list[tuple[object, bool]] = []

    def record(outcome: object) -> None:
        seen.append((outcome, threading.get_ident() == loop))

    def fails() -> int:
        raise ValueError("no such file")

    agent.submit(Lane.SCAN, lambda: threading.get_ident() != loop, record)  # ran elsewhere
    agent.submit(Lane.LOAD, fails, record)
    assert select.select([agent.fd], [], [], 10)[0] == [agent.fd]  # the loop is woken
    agent.wait(10)
    assert sorted(str(o) for o, _ in seen) == ["True", "no such file"]
    assert all(on_loop for _, on_loop in seen)
    assert isinstance(next(o for o, _ in seen if not isinstance(o, bool)), ValueError)  # a value, not a crash
    assert agent.pending == 0 and agent.drain() is False


def test_wait_runs_the_work_completions_start(agent: RepositoryAgent) -> None:
    order: list[str] = []

    def first(_: object) -> None:
        order.append("first")
        agent.submit(Lane.LOAD, lambda: None, lambda _: order.append("second"))

    agent.submit(Lane.SYNC, lambda: None, first)
    agent.wait(10)
    assert order == ["first", "second"]


@pytest.mark.parametrize("threads", [1, 3])
def test_the_load_lane_runs_as_many_loads_at_once_as_it_has_threads(threads: int) -> None:
    agent = RepositoryAgent(load_threads=threads)
    running, most = 0, 0
    lock = threading.Lock()

    def load() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.2)
        with lock:
            running -= 1

    try:
        for _ in range(3):
            agent.submit(Lane.LOAD, load, lambda _: None)
        agent.wait(10)
    finally:
        agent.close()
    assert most == threads


def test_quick_work_does_not_queue_behind_loads(agent: RepositoryAgent) -> None:
    release = threading.Event()
    done: list[str] = []
    for _ in range(2):  # every load thread busy
        agent.submit(Lane.LOAD, lambda: release.wait(10), lambda _: done.append("load"))
    agent.submit(Lane.SCAN, lambda: None, lambda _: done.append("scan"))
    deadline = time.monotonic() + 10
    while "scan" not in done:
        assert time.monotonic() < deadline, "the scan waited for the loads"
        select.select([agent.fd], [], [], 1)
        agent.drain()
    release.set()
    agent.wait(10)
    assert done == ["scan", "load", "load"]
