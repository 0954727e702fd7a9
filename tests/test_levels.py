"""The test levels (tests/conftest.py): every test module states one, and under the unit level a process
cannot start, by any of the ways the suite's code starts one: refused, and the attempt kept even when the code
under test catches the refusal."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import conftest

LEVEL = "unit"

TESTS = Path(__file__).parent


def test_every_test_module_states_a_level() -> None:
    modules = sorted(TESTS.rglob("test_*.py"))
    assert modules
    assert [str(m.relative_to(TESTS)) for m in modules if conftest._level(m) is None] == []


@pytest.mark.parametrize(("text", "level"), [
    ('LEVEL = "unit"\n', "unit"), ("x = 1\nLEVEL = 'e2e'  # starts a group\n", "e2e"), ('LEVEL = "slow"\n', "slow"),
    ("", None), ('LEVEL = "quick"\n', None), ('    LEVEL = "unit"\n', None), ('# LEVEL = "unit"\n', None),
])
def test_the_level_is_read_from_the_text(tmp_path: Path, text: str, level: str | None) -> None:
    module = tmp_path / "test_m.py"
    module.write_text(text)
    assert conftest._level(module) == level


def _fork() -> None:
    if os.fork() == 0:  # pragma: no cover - only if the guard failed
        os._exit(0)


STARTS: dict[str, Callable[[], object]] = {
    "subprocess": lambda: subprocess.run(["true"], check=False),
    "multiprocessing": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    "fork": _fork,
    "system": lambda: os.system("true"),
    "posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], {}),
}


@pytest.mark.parametrize("start", STARTS.values(), ids=STARTS.keys())
def test_the_guard_refuses_a_process_and_keeps_the_attempt(start: Callable[[], object]) -> None:
    guard = conftest._SpawnGuard()  # one of this test's own, over the one this unit test runs under
    guard.install("this test")
    try:
        with pytest.raises(RuntimeError, match="this test starts no process"):
            start()
        try:
            start()
        except RuntimeError:
            pass  # code that swallows the refusal: the attempt is kept all the same
    finally:
        guard.remove()
    assert len(guard.take()) == 2 and guard.take() == []


def test_the_guard_puts_everything_back() -> None:
    before = [getattr(owner, name) for owner, name in conftest._SpawnGuard.TARGETS]
    guard = conftest._SpawnGuard()
    guard.install("this test")
    assert all(getattr(owner, name) is not was
               for (owner, name), was in zip(conftest._SpawnGuard.TARGETS, before, strict=True))
    guard.remove()
    assert [getattr(owner, name) for owner, name in conftest._SpawnGuard.TARGETS] == before
