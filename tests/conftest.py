"""Fixtures that start the real process group (router, workers, HTTP and gRPC
ingress) on free loopback ports, with a model repository made on the fly; and the test levels (each
module's ``LEVEL``, and the guard that keeps the unit level free of processes)."""

from __future__ import annotations

import _posixsubprocess
import functools
import multiprocessing.process
import os
import re
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from types import FrameType
from typing import NoReturn

import pytest

from tests.support import fuzz, models, vllm_group
from tests.support.group import Server, SharedGroups, start_server

# Bytecode is cached, whatever the environment says (PYTHONDONTWRITEBYTECODE=1 on the development and CI
# hosts): every group the suite starts runs 5-8 Python processes, and each compiled Conveyor's modules
# again, some 0.5 s of CPU a process; cached, the e2e modules took 18% less CPU. Here for this process's
# test modules (pytest caches their rewritten asserts), in the environment for the processes it starts.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# vLLM's CPU model-worker processes do not end on their own when an engine shuts down: its executor waits
# this long (5 s by default) before it terminates them, and every engine a test stops (its group's stop,
# an unload) paid that wait. The groups the tests start inherit it.
os.environ.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "1")


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> str:
    repo = str(tmp_path_factory.mktemp("models"))
    models.build_test_repository(repo)
    return repo


@pytest.fixture(scope="session")
def light_repo(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``model_repo`` but for its TorchScript models, for the groups of tests that serve none of them."""
    repo = str(tmp_path_factory.mktemp("light_models"))
    models.build_test_repository(repo, torch=False)
    return repo


@pytest.fixture(scope="session")
def shared_groups() -> Iterator[SharedGroups]:
    """Groups shared by the modules that ask with the same repository and flags (tests/support/group.py)."""
    groups = SharedGroups(f"sg{os.getpid()}x")
    yield groups
    groups.stop()


@pytest.fixture(scope="session")
def client_shm_server(light_repo: str, shared_groups: SharedGroups) -> Server:
    """One worker, clients' shared memory allowed: the group of the tests that register regions (each test
    unregisters what it registered)."""
    return shared_groups.get(light_repo, "--workers", "1", "--allow-client-shm", "true")


@pytest.fixture(scope="session")
def server(model_repo: str) -> Iterator[Server]:
    srv = start_server(model_repo, f"t{os.getpid()}", "--workers", "2")
    yield srv
    code = srv.stop()
    assert code == 0
    assert srv.shm_segments() == [], "shared memory left behind after shutdown"


@pytest.fixture(scope="session")
def _vllm_groups() -> Iterator[None]:
    yield
    vllm_group.stop()


@pytest.fixture(scope="module")
def served_llm(tmp_path_factory: pytest.TempPathFactory, _vllm_groups: None) -> vllm_group.VllmGroup:
    """The tiny Llama on a real group (tests/support/vllm_group.py), one for the session's vLLM tests."""
    return vllm_group.group(tmp_path_factory)


# The levels: every test module states its own, ``LEVEL = "unit"``, ``"slow"`` or ``"e2e"`` (at the top, read
# from its text, so that ``-m unit`` need not import the others): e2e starts processes (a group, an actor, a
# server, a model's child); slow starts none of Conveyor's but takes seconds (a compiler, a framework's
# conversion, torch's or vLLM's import, which runs ldconfig); unit runs in this process alone, quickly
# (``pytest -m unit``, ``make unit``: the quick level). A module that states none, or another word, fails
# collection. A unit test cannot start a process: the spawn guard below refuses it.
LEVELS = ("unit", "slow", "e2e")
_LEVEL = re.compile(r"""^LEVEL = ["'](\w+)["']""", re.MULTILINE)


@functools.cache
def _level(path: Path) -> str | None:
    """The level a test module states (None: none, or no level's name)."""
    found = _LEVEL.search(path.read_text(encoding="utf-8"))
    return found.group(1) if found and found.group(1) in LEVELS else None


def _is_test_module(path: Path) -> bool:
    return path.suffix == ".py" and path.name.startswith("test_")


class _NoLevel(pytest.File):
    """A test module that states no level: collected as this error alone."""

    def collect(self) -> Iterator[pytest.Item]:
        raise self.CollectError(f"{self.path}: a test module states its level, one of {', '.join(LEVELS)}: "
                                f'LEVEL = "unit" (tests/conftest.py says what each means)')


def pytest_configure(config: pytest.Config) -> None:
    if config.option.markexpr == "unit":
        fuzz.QUICK = True  # before any test module is imported: their fuzz targets try fewer cases
        _GUARD.install("the unit level (-m unit)")  # collection included: a module's import starts nothing


def pytest_unconfigure(config: pytest.Config) -> None:
    _GUARD.remove()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``-m LEVEL`` does not even import the other levels' modules: their imports (torch, vLLM, TensorFlow)
    were most of the quick level's time."""
    level = config.option.markexpr
    if level in LEVELS and _is_test_module(collection_path) and _level(collection_path) not in (level, None):
        return True
    return None


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if _is_test_module(module_path) and _level(module_path) is None:
        return _NoLevel.from_parent(parent, path=module_path)
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its module's level (``pytest -m unit`` runs the quick level alone)."""
    for item in items:
        level = _level(item.path)
        if level is not None:
            item.add_marker(level)


class _SpawnGuard:
    """While installed, starting a process raises, and the attempt is kept: a unit test that catches the
    error still fails. Every way the suite's code starts one ends in one of these."""

    TARGETS = ((subprocess.Popen, "__init__"), (multiprocessing.process.BaseProcess, "start"), (os, "fork"),
               (os, "forkpty"), (os, "posix_spawn"), (os, "posix_spawnp"), (os, "system"),
               (_posixsubprocess, "fork_exec"))  # what subprocess and multiprocessing's helpers (its resource
    # tracker, its forkserver) call at last

    def __init__(self) -> None:
        self.why = ""  # what installed it ("": not installed)
        self.tried: list[str] = []
        self._saved: list[tuple[object, str, object]] = []

    def install(self, why: str) -> None:
        if self.why:
            return
        self.why = why
        for owner, name in self.TARGETS:
            if hasattr(owner, name):
                self._saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, self._refuse(f"{getattr(owner, '__name__', owner)}.{name}"))

    def _refuse(self, what: str) -> Callable[..., NoReturn]:
        def refuse(*args: object, **kwargs: object) -> NoReturn:
            self.tried.append(f"{what} from {_nearest_own_frame()}")
            raise RuntimeError(f"{what}: {self.why} starts no process; a test module that does states "
                               f'LEVEL = "e2e"')

        return refuse

    def remove(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
        self.why = ""

    def take(self) -> list[str]:
        tried, self.tried = self.tried, []
        return tried


_GUARD = _SpawnGuard()
_CHECKOUT = str(Path(__file__).resolve().parents[1])


def _nearest_own_frame() -> str:
    """Where the checkout's code (a test, a support module, Conveyor's) led to the spawn: file and line."""
    first = sys._getframe(2)
    frame: FrameType | None = first
    while frame is not None:
        name = os.path.realpath(frame.f_code.co_filename)
        if name.startswith(_CHECKOUT) and name != os.path.realpath(__file__):
            return f"{os.path.relpath(name, _CHECKOUT)}:{frame.f_lineno}"
        frame = frame.f_back
    return f"{first.f_code.co_filename}:{first.f_lineno}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


def _guarded(item: pytest.Item) -> Generator[None, None, None]:
    """A unit test's setup (its fixtures, whatever their scope) and its call run under the spawn guard
    (teardown does not: the session's e2e fixtures may end theirs after the last test, a unit one)."""
    own = _level(item.path) == "unit" and not _GUARD.why
    if own:
        _GUARD.install(f"a unit-level test ({item.nodeid})")
    try:
        result = yield
    finally:
        if own:
            _GUARD.remove()
        tried = _GUARD.take()
    if tried:  # refused, and the error caught by the code under test
        pytest.fail(f"a unit-level test started a process ({', '.join(dict.fromkeys(tried))}): state the module's "
                    f'LEVEL = "e2e", or start none', pytrace=False)
    return result


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per fuzz target: how many generated cases this run tried; then the soak test's figures."""
    from tests.support.fuzz import CASES
    from tests.support.soak_report import LINES

    if LINES:
        terminalreporter.write_sep("-", "soak")
        for line in LINES:
            terminalreporter.write_line(line)

    if CASES:
        terminalreporter.write_sep("-", "fuzz cases tried")
        for name, count in sorted(CASES.items()):
            terminalreporter.write_line(f"{name}: {count}")
        terminalreporter.write_line(f"total: {sum(CASES.values())}")
