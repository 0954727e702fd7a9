"""``pb_utils.Logger``: model log lines go to Python logging (the worker's log)."""

from __future__ import annotations

import enum
import logging

_log = logging.getLogger("triton_python_backend_utils")


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_TO_LOGGING = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,
}


class Logger:
    """Static methods, as in Triton (models call ``pb_utils.Logger.log_info(...)``);
    the levels are also ``Logger.LogLevel.INFO`` and ``Logger.INFO``, as Triton exports them."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        if not isinstance(level, LogLevel):  # Triton's binding takes its enum only, not an int
            raise TypeError(f"log(): level must be a pb_utils.LogLevel, not {type(level).__name__}")
        _log.log(_TO_LOGGING[level], "%s", _text(message))

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", _text(message))

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", _text(message))

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", _text(message))

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", _text(message))


def _text(message: object) -> str:
    """A log message must be a str, as Triton's binding has it (TypeError otherwise)."""
    if not isinstance(message, str):
        raise TypeError(f"a log message must be a str, not {type(message).__name__}")
    return message
