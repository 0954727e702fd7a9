"""The lifecycle with its repository agent (router/lifecycle/, router/repository/agent.py),
without a group: what the loop does at once, what it applies when the agent's results come
back (start-up, a load, an unload that cancels a load, the index, a registration)."""

from __future__ import annotations

import select
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.lifecycle import Answer, ControlMode, ModelControlConfig, ModelLifecycle
from conveyor.router.registry import ModelRegistry
from tests.support.router_core import write_model

LEVEL = "unit"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for name in ("a", "b"):
        write_model(tmp_path / "repo", name)
    return tmp_path / "repo"


def _lifecycle(repo: Path, mode: ControlMode, load: list[str] | None = None) -> Iterator[ModelLifecycle]:
    control = ModelControlConfig(mode, tuple(load or ()), strict_config=True)
    lifecycle = ModelLifecycle(ModelRegistry(), [str(repo)], control)
    yield lifecycle
    lifecycle.agent.close()


@pytest.fixture
def explicit(repo: Path) -> Iterator[ModelLifecycle]:
    yield from _lifecycle(repo, ControlMode.EXPLICIT, ["a"])


def _answers(lifecycle: ModelLifecycle) -> dict[str, Answer]:
    """What the agent's results answered, by caller."""
    lifecycle.agent.wait(30)
    return {a.reply_to: a for a in lifecycle.settle(set()).answers}


def test_start_up_reads_the_repository_on_the_agent(repo: Path) -> None:
    for lifecycle in _lifecycle(repo, ControlMode.NONE):
        lifecycle.begin_startup()
        assert lifecycle.starting and lifecycle.registry.models == {}  # nothing read on the caller's thread
        assert lifecycle.startup_outcome() is None  # --exit-on-error waits
        lifecycle.agent.wait(30)
        assert not lifecycle.starting and sorted(lifecycle.registry.models) == ["a", "b"]


def test_an_unload_cancels_a_load_still_being_prepared(explicit: ModelLifecycle) -> None:
    explicit.startup()
    explicit.load("b", "caller")
    explicit.unload("b")  # before the agent has even looked at the repository
    answers = _answers(explicit)
    error = answers["caller"].error
    assert error is not None and error.status is Status.CANCELLED
    assert error.message == "failed to load 'b': 'b' was unloaded while it was loading"
    assert "b" not in explicit.registry.models


def test_an_unload_after_the_look_cancels_too(explicit: ModelLifecycle) -> None:
    explicit.startup()
    explicit.load("b", "caller")
    # Until the look has come back: its completion asks for the preparation, which then runs.
    while not explicit._preparing:
        select.select([explicit.agent.fd], [], [], 10)
        explicit.agent.drain()
    explicit.unload("b")
    answers = _answers(explicit)
    assert answers["caller"].error is not None and answers["caller"].error.status is Status.CANCELLED
    assert "b" not in explicit.registry.models  # the preparation came back and was dropped
    assert explicit.registry.unloaded.get("b") == "unloaded"  # the index says so, as after a load and an unload


def test_a_model_the_repository_lacks_fails_after_the_look(explicit: ModelLifecycle) -> None:
    explicit.startup()
    explicit.load("nope", "caller")
    error = _answers(explicit)["caller"].error
    assert error is not None and error.status is Status.CLIENT_MISTAKE  # Triton's INTERNAL
    assert error.message == "failed to load 'nope', failed to poll from model repository"


def test_what_is_wrong_with_the_call_is_raised_at_once(explicit: ModelLifecycle) -> None:
    with pytest.raises(ConveyorError, match="failed to poll from model repository"):
        explicit.load("a", "caller", config_json="{not json")
    assert explicit.agent.pending == 0


def test_the_index_is_answered_from_the_agent(explicit: ModelLifecycle) -> None:
    explicit.startup()
    explicit.request_index(False, "caller")
    rows = _answers(explicit)["caller"].result
    assert [(r["name"], r["state"]) for r in rows] == [("a", "LOADING"), ("b", "")]


def test_a_registration_is_checked_on_the_agent(explicit: ModelLifecycle, tmp_path: Path) -> None:
    explicit.startup()
    write_model(tmp_path / "more", "c")
    explicit.register(str(tmp_path / "more"), {"c": "c"}, "first")
    explicit.register(str(tmp_path / "nowhere"), {"x": "x"}, "second")
    answers = _answers(explicit)
    assert answers["first"].error is None
    error = answers["second"].error
    assert error is not None and error.message == f"failed to register '{tmp_path / 'nowhere'}', repository not found"
    with pytest.raises(ConveyorError, match="has already been registered"):
        explicit.register(str(tmp_path / "more"), {"c": "c"}, "third")
    explicit.load("c", "load")
    explicit.agent.wait(30)
    assert "c" in explicit.registry.models


def _refused(call: Callable[[], None]) -> tuple[Status, str]:
    with pytest.raises(ConveyorError) as refused:
        call()
    return refused.value.status, refused.value.message


def test_the_openai_frontends_calls_load_what_is_not_loaded_and_unload_what_is(explicit: ModelLifecycle) -> None:
    """Triton's OpenAI frontend's load/unload (``frontend``): refused at once, in its words, for a model on
    its list (loaded or loading) and one not on it; the KServe calls are not (a load reloads)."""
    explicit.startup()
    assert _refused(lambda: explicit.load("a", "dup", frontend=True)) == (
        Status.ALREADY_EXISTS, "Model 'a' is already loaded")
    explicit.load("b", "first", frontend=True)
    assert _refused(lambda: explicit.load("b", "second", frontend=True)) == (
        Status.ALREADY_EXISTS, "Model 'b' is already loaded")  # on its way: of concurrent loads one loads
    explicit.unload("b", frontend=True)  # a model loading is on the list: its load is cancelled
    assert _refused(lambda: explicit.unload("b", frontend=True)) == (Status.NOT_FOUND, "Unknown model: b")
    assert _refused(lambda: explicit.unload("nope", frontend=True)) == (Status.NOT_FOUND, "Unknown model: nope")
    assert _refused(lambda: explicit.load("..", "dots", frontend=True))[0] is Status.INVALID_ARG  # Triton's check
    explicit.load("a", "kserve")  # not refused: Triton's KServe load of a loaded model reloads it
    answers = _answers(explicit)
    assert answers["first"].error is not None and answers["first"].error.status is Status.CANCELLED
    assert "dup" not in answers and "second" not in answers  # refused, not answered later too


def test_the_openai_frontends_calls_need_explicit_mode(repo: Path) -> None:
    for none in _lifecycle(repo, ControlMode.NONE):
        none.startup()
        refusal = (Status.UNSUPPORTED, "Model load/unload requires --model-control-mode=explicit")
        assert _refused(lambda: none.load("a", "caller", frontend=True)) == refusal  # noqa: B023 (called at once)
        assert _refused(lambda: none.unload("a", frontend=True)) == refusal  # noqa: B023


def test_a_start_up_model_no_repository_holds_is_named_in_tritons_words(
        repo: Path, caplog: pytest.LogCaptureFixture) -> None:
    for lifecycle in _lifecycle(repo, ControlMode.EXPLICIT, ["nowhere"]):
        lifecycle.startup()
        message = "failed to poll model 'nowhere': model not found in any model repository"
        assert lifecycle.startup_outcome() == message  # --exit-on-error's reason
        assert f"{message}." in caplog.messages  # and Triton's log line
