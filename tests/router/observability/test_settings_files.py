"""The router's settings hub refuses a client's log or trace file, whichever ingress the request
came by, before it applies anything (Triton's CVE-2024-0087 fix: UNSUPPORTED, its words)."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.deploy.runtime.log_settings import ProcessLog
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.start_only import LOG_FILE_REFUSAL, TRACE_FILE_REFUSAL
from conveyor.router.observability.trace_settings import TraceConfig, TraceSettings
from conveyor.router.settings_hub import SettingsHub

LEVEL = "unit"


@pytest.fixture
def hub() -> tuple[SettingsHub, list[bytes]]:
    sent: list[bytes] = []
    return SettingsHub(TraceConfig(TraceSettings(trace_file="/start/trace.json")), sent.append), sent


@pytest.mark.parametrize("settings", [
    {"log_file": "/tmp/pwned.log"},
    {"log_file": ""},  # "" (stderr) too
    {"log_file": ProcessLog.settings.log_file},  # the current value too
    {"log_verbose_level": 1, "log_info": False, "log_file": "/tmp/pwned.log"},  # nothing else is applied
])
def test_log_file_refused(hub: tuple[SettingsHub, list[bytes]], settings: dict[str, Any]) -> None:
    settings_hub, sent = hub
    before = ProcessLog.settings
    with pytest.raises(ConveyorError) as err:
        settings_hub.log_settings(settings)
    assert (err.value.status, err.value.message) == (Status.UNSUPPORTED, LOG_FILE_REFUSAL)
    assert ProcessLog.settings == before and sent == []


def test_a_null_log_setting_is_left_as_it_is(hub: tuple[SettingsHub, list[bytes]]) -> None:
    settings_hub, sent = hub
    before = ProcessLog.settings
    assert settings_hub.log_settings({"log_file": None, "log_info": None}) == before.wire()
    assert ProcessLog.settings == before and sent == []


@pytest.mark.parametrize("settings", [
    {"trace_file": "/tmp/pwned.trace"},
    {"trace_file": None},  # HTTP null, a gRPC entry without values
    {"trace_file": "/start/trace.json"},
    {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_file": "/tmp/pwned.trace"},
])
@pytest.mark.parametrize("model", ["", "simple"])
def test_trace_file_refused(hub: tuple[SettingsHub, list[bytes]], settings: dict[str, Any], model: str) -> None:
    settings_hub, sent = hub
    before = settings_hub.trace_settings(model)
    with pytest.raises(ConveyorError) as err:
        settings_hub.trace_settings(model, settings, known=lambda name: name == "simple")
    assert (err.value.status, err.value.message) == (Status.UNSUPPORTED, TRACE_FILE_REFUSAL)
    assert settings_hub.trace_settings(model) == before and sent == []
    assert before["trace_file"] == "/start/trace.json"


def test_an_unknown_model_is_refused_before_the_file(hub: tuple[SettingsHub, list[bytes]]) -> None:
    # Triton's order: the model's readiness, then the settings.
    with pytest.raises(ConveyorError) as err:
        hub[0].trace_settings("nope", {"trace_file": "/tmp/x"}, known=lambda name: False)
    assert (err.value.status, err.value.message) == (Status.INVALID_ARG, "Request for unknown model : nope")
