"""The trace extension's settings as a client sends them: a value of the wrong type is a client's
mistake (INVALID_ARG), never an exception that leaves the router's control op unanswered."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.observability.trace_settings import TraceSettings, TraceSettingsStore

LEVEL = "unit"


@pytest.mark.parametrize("level", [True, 7, 1.5, {"a": 1}, [], [["OFF"]], ["LOUD"], None])
def test_a_trace_level_that_is_no_level_name_is_refused(level: Any) -> None:
    store = TraceSettingsStore(TraceSettings())
    if level is None:  # null resets the setting: not a mistake
        store.update("", {"trace_level": level})
        return
    with pytest.raises(ConveyorError) as err:
        store.update("", {"trace_level": level})
    assert err.value.status is Status.INVALID_ARG
    assert "trace_level must be some of OFF, TIMESTAMPS, TENSORS" in str(err.value)
    assert store.wire()["trace_level"] == ["OFF"]  # nothing applied


@pytest.mark.parametrize(("name", "value"), [("trace_rate", [1, 2]), ("trace_count", {}), ("log_frequency", "x")])
def test_a_count_that_is_no_integer_is_refused(name: str, value: Any) -> None:
    with pytest.raises(ConveyorError) as err:
        TraceSettingsStore(TraceSettings()).update("m", {name: value})
    assert err.value.status is Status.INVALID_ARG


def test_levels_as_a_string_or_a_list() -> None:
    store = TraceSettingsStore(TraceSettings())
    store.update("", {"trace_level": "TIMESTAMPS"})
    assert store.wire()["trace_level"] == ["TIMESTAMPS"]
    store.update("m", {"trace_level": ["TIMESTAMPS", "TENSORS"]})
    assert store.wire("m")["trace_level"] == ["TIMESTAMPS", "TENSORS"]
