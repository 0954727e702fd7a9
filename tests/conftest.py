"""Fixtures that start the real process group (router, workers, HTTP and gRPC
ingress) on free loopback ports, with a model repository made on the fly."""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import fuzz, models, vllm_group
from tests.support.group import Server, start_server

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


# The levels: e2e (starts processes: a group, an actor, a server), slow (one process, but seconds per
# test: a compiler, a framework's conversion; the module says so with ``pytestmark = pytest.mark.slow``) and
# unit (the rest: ``pytest -m unit``, the quick level). Set here, from the module's text and that of the
# tests/support modules it imports (theirs too), so that a new test gets its level without anyone remembering.
_STARTS_PROCESSES = re.compile(r"tests\.support\.group|start_server|subprocess|Popen|multiprocessing"
                               r"|extra_grpc_ingress_process|real_triton")
_SLOW = re.compile(r"pytest\.mark\.slow\b")
_SUPPORT_IMPORT = re.compile(r"^\s*(?:from|import) tests\.support\.(\w+)", re.MULTILINE)
_SUPPORT = Path(__file__).parent / "support"


@functools.cache
def _starts_processes(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    if _STARTS_PROCESSES.search(text):
        return True
    return any(_starts_processes(support) for name in _SUPPORT_IMPORT.findall(text)
               if (support := _SUPPORT / f"{name}.py").is_file() and support != path)


def _level(path: Path) -> str:
    if _starts_processes(path):
        return "e2e"
    return "slow" if _SLOW.search(path.read_text(encoding="utf-8")) else "unit"


def pytest_configure(config: pytest.Config) -> None:
    if config.option.markexpr == "unit":
        fuzz.QUICK = True  # before any test module is imported: their fuzz targets try fewer cases


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``-m unit`` does not even import the other modules: their imports (torch, vLLM, TensorFlow)
    were most of the quick level's time."""
    if (config.option.markexpr == "unit" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and _level(collection_path) != "unit"):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its level (``pytest -m unit`` runs the quick level alone)."""
    levels: dict[str, pytest.MarkDecorator] = {}
    for item in items:
        path = str(item.path)
        if path not in levels:
            levels[path] = getattr(pytest.mark, _level(item.path))
        item.add_marker(levels[path])


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
