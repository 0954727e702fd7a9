"""Triton's log settings (logging extension), checked and applied to this process's logging.

The router keeps the group's settings and sends every change to each worker and
ingress (``SettingsUpdate``); each process applies them here, so
``POST /v2/logging`` changes every process's log at once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from conveyor.proto.errors import invalid_arg

# Triton's two layouts (--log-format default|ISO8601: common's logging.cc LogPreamble) and Conveyor's own line,
# which names the process's role ('conveyor serve''s default; tritonserver's is Triton's "default").
FORMATS = ("default", "ISO8601", "conveyor")
TRITON_FORMATS = ("default", "ISO8601")
# Triton escapes each message as a JSON string unless this is "0" (common's Logger::ESCAPE_ENVIRONMENT_VARIABLE).
ESCAPE_ENV = "TRITON_SERVER_ESCAPE_LOG_MESSAGES"
# Triton's level letters (Logger::LEVEL_NAMES); verbose lines are info lines there.
_LETTER = {logging.CRITICAL: "E", logging.ERROR: "E", logging.WARNING: "W"}
# rapidjson's escapes (TritonJson::SerializeString): the quote, the backslash, and the control characters.
_JSON_ESCAPES = {**{c: f"\\u{c:04X}" for c in range(0x20)}, 0x08: "\\b", 0x09: "\\t", 0x0A: "\\n",
                 0x0C: "\\f", 0x0D: "\\r", 0x22: '\\"', 0x5C: "\\\\"}
# syslog(3) priorities of the logging levels.
_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


@dataclass(frozen=True)
class LogSettings:
    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "conveyor"

    def wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def updated(self, changes: dict[str, Any]) -> LogSettings:
        """These settings with ``changes`` (a POST body) applied; a wrong name or type is INVALID_ARG."""
        fields = {f.name: f.type for f in dataclasses.fields(self)}
        for name, value in changes.items():
            kind = fields.get(name)
            if kind is None:
                raise invalid_arg(f"log setting '{name}' is not supported")
            if value is None:
                raise invalid_arg(f"log setting '{name}' cannot be cleared")
            want = {"bool": bool, "int": int, "str": str}[str(kind)]
            negative = isinstance(value, int) and value < 0
            if not isinstance(value, want) or (want is int and (isinstance(value, bool) or negative)):
                raise invalid_arg(f"expect a {str(kind).replace('str', 'string')} for log setting '{name}'")
        if changes.get("log_format", self.log_format) not in FORMATS:
            raise invalid_arg(f"log_format must be one of {', '.join(FORMATS)}")
        return dataclasses.replace(self, **changes)


class _LevelSwitch(logging.Filter):
    """Drops the levels turned off (log_info/log_warning/log_error)."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self._off = {logging.INFO} if not settings.log_info else set()
        if not settings.log_warning:
            self._off.add(logging.WARNING)
        if not settings.log_error:
            self._off |= {logging.ERROR, logging.CRITICAL}

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno not in self._off


def json_string(text: str) -> str:
    """``text`` as Triton's log escapes a message: a JSON string, as rapidjson writes it."""
    return f'"{text.translate(_JSON_ESCAPES)}"'


class TritonFormatter(logging.Formatter):
    """Triton's log line (common's logging.cc): ``E1207 19:29:00.123456 <pid> <file>:<line>] "<message>"`` for
    "default", ``2026-12-07T19:29:00Z E <pid> <file>:<line>] "<message>"`` for ISO8601 (UTC, as Triton's
    gmtime_r); the message, with any traceback, escaped as one JSON string unless $TRITON_SERVER_ESCAPE_LOG_MESSAGES
    is "0"."""

    def __init__(self, iso8601: bool) -> None:
        super().__init__()
        self._iso8601 = iso8601
        self._escape = os.environ.get(ESCAPE_ENV) != "0"  # read once, as Triton's Logger reads it at start

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        if self._escape:
            message = json_string(message)
        letter = _LETTER.get(record.levelno, "I")
        t = time.gmtime(record.created)
        place = f"{record.process} {record.filename}:{record.lineno}] "
        if self._iso8601:
            return f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', t)} {letter} {place}{message}"
        micros = int(record.created * 1_000_000) % 1_000_000
        return f"{letter}{time.strftime('%m%d %H:%M:%S', t)}.{micros:06d} {place}{message}"


class JournalFormatter(logging.Formatter):
    """A syslog priority prefix (``<N>``) that journald reads as the line's priority."""

    def format(self, record: logging.LogRecord) -> str:
        priority = _PRIORITY.get(record.levelno, 6 if record.levelno < logging.WARNING else 3)
        return f"<{priority}>{super().format(record)}"


def make_handler(settings: LogSettings, role: str, journal: bool) -> logging.Handler:
    """A handler writing to ``log_file`` (appended: every process of the group shares it) or stderr."""
    handler: logging.Handler
    if settings.log_file:
        handler = logging.FileHandler(settings.log_file, mode="a", encoding="utf-8")
        journal = False
    else:
        handler = logging.StreamHandler(sys.stderr)
    if journal:
        # journald adds the time, the unit and the pid: keep the line to what only we know.
        handler.setFormatter(JournalFormatter(f"{role} %(levelname)s %(name)s: %(message)s"))
    elif settings.log_format in TRITON_FORMATS:
        handler.setFormatter(TritonFormatter(iso8601=settings.log_format == "ISO8601"))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {role}[%(process)d] %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_LevelSwitch(settings))
    return handler


class ProcessLog:
    """This process's logging: the role it names itself by and the settings now applied."""

    role = "conveyor"
    journal = False
    settings = LogSettings()

    @classmethod
    def apply(cls, settings: LogSettings) -> None:
        root = logging.getLogger()
        for old in list(root.handlers):
            root.removeHandler(old)
            old.close()
        root.addHandler(make_handler(settings, cls.role, cls.journal))
        root.setLevel(logging.DEBUG if settings.log_verbose_level > 0 else logging.INFO)
        changed, cls.settings = settings != cls.settings, settings
        if changed:
            logging.getLogger(__name__).debug("%s: log settings now %s", cls.role, settings.wire())

    @classmethod
    def apply_wire(cls, doc: dict[str, Any]) -> None:
        """Settings as the router sends them; a malformed message keeps the current ones."""
        try:
            settings = LogSettings().updated(doc)
        except Exception:
            logging.getLogger(__name__).exception("log settings from the router were not applied")
            return
        if settings != cls.settings:
            cls.apply(settings)
