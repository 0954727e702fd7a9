"""Log lines in Triton's layouts (common's logging.cc), which Triton's QA greps (`^E[0-9][0-9][0-9][0-9].*<message>`),
and Conveyor's own line, which `conveyor serve` keeps."""

from __future__ import annotations

import logging

import pytest

from conveyor.deploy.cli import build_parser, build_tritonserver_parser
from conveyor.deploy.runtime.log_settings import ESCAPE_ENV, LogSettings, json_string, make_handler

LEVEL = "unit"

# 2026-12-07 19:29:00.012345 UTC
_CREATED = 1796671740.012345


def _line(fmt: str, level: int, msg: str, args: tuple[object, ...] = ()) -> str:
    record = logging.LogRecord("conveyor.router.x", level, "/src/router/lifecycle/loads.py", 236, msg, args, None)
    record.created, record.process = _CREATED, 4242
    return make_handler(LogSettings(log_format=fmt), "router", journal=False).format(record)


def test_default_is_tritons_glog_line_with_the_message_as_a_json_string() -> None:
    line = _line("default", logging.ERROR, "Poll failed for model directory '%s': %s", ("m", 'a "b"\n\tc\x01'))
    assert line == ("E1207 19:29:00.012345 4242 loads.py:236] "
                    '"Poll failed for model directory \'m\': a \\"b\\"\\n\\tc\\u0001"')


@pytest.mark.parametrize(("level", "letter"), [(logging.ERROR, "E"), (logging.CRITICAL, "E"), (logging.WARNING, "W"),
                                               (logging.INFO, "I"), (logging.DEBUG, "I")])
def test_level_letters_are_tritons(level: int, letter: str) -> None:
    # Triton has three letters; its verbose lines are info lines.
    assert _line("default", level, "x").startswith(f"{letter}1207 ")
    assert _line("ISO8601", level, "x") == f'2026-12-07T19:29:00Z {letter} 4242 loads.py:236] "x"'


def test_escaping_is_off_when_triton_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ESCAPE_ENV, "0")
    assert _line("default", logging.WARNING, 'a "b"').endswith('loads.py:236] a "b"')
    monkeypatch.setenv(ESCAPE_ENV, "1")
    assert _line("default", logging.WARNING, 'a "b"').endswith('] "a \\"b\\""')


def test_json_string_writes_what_rapidjson_writes() -> None:
    # Non-ASCII text stays as it is (UTF-8 in, UTF-8 out); '/' is not escaped; control characters in upper-case hex.
    assert json_string("é/\x1f\\\b\f\r") == '"é/\\u001F\\\\\\b\\f\\r"'


def test_conveyor_line_names_the_role() -> None:
    assert _line("conveyor", logging.ERROR, "x").endswith(" router[4242] ERROR conveyor.router.x: x")


def test_each_command_has_its_default_layout() -> None:
    assert build_tritonserver_parser().parse_args(["--model-repository=/m"]).log_format == "default"
    assert build_parser().parse_args(["serve", "--model-repository=/m"]).log_format == "conveyor"
