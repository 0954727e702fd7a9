"""Triton's trace settings (trace extension): global ones plus per-model overrides.

Values travel as strings (a list of strings for ``trace_level``), as Triton's
``$trace_setting_response`` has them. A model setting given as null goes back to
the global one; a global one given as null goes back to its value at start.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from conveyor.proto.errors import invalid_arg

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")


@dataclass(frozen=True)
class TraceSettings:
    trace_file: str = ""
    trace_level: tuple[str, ...] = ("OFF",)
    trace_rate: int = 1000  # every Nth request is traced
    trace_count: int = -1  # traces left to take; -1: no limit
    log_frequency: int = 0  # write the file every N traces (0: when the file changes and at exit)

    @property
    def on(self) -> bool:
        return self.trace_level != ("OFF",) and self.trace_count != 0

    def wire(self) -> dict[str, Any]:
        return {"trace_file": self.trace_file, "trace_level": list(self.trace_level),
                "trace_rate": str(self.trace_rate), "trace_count": str(self.trace_count),
                "log_frequency": str(self.log_frequency)}


def parse_value(name: str, value: Any) -> Any:
    """One setting from JSON, the gRPC string lists or ``--trace-config``; INVALID_ARG when wrong."""
    if name == "trace_level":
        levels = [value] if isinstance(value, str) else list(value)
        if not levels or any(v not in LEVELS for v in levels):
            raise invalid_arg(f"trace_level must be some of {', '.join(LEVELS)}, got {levels}")
        # OFF wins only alone; TIMESTAMPS is what Conveyor records for TENSORS as well.
        return ("OFF",) if levels == ["OFF"] else tuple(v for v in levels if v != "OFF")
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if name == "trace_file":
        if not isinstance(value, str):
            raise invalid_arg("trace_file must be a string")
        return value
    if name in ("trace_rate", "trace_count", "log_frequency"):
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise invalid_arg(f"{name} must be an integer, got '{value}'") from None
        if number < (-1 if name == "trace_count" else 0) or (name == "trace_rate" and number == 0):
            raise invalid_arg(f"{name} {number} is out of range")
        return number
    raise invalid_arg(f"trace setting '{name}' is not supported")


class TraceSettingsStore:
    """The one place the group's trace settings live (the router)."""

    def __init__(self, initial: TraceSettings) -> None:
        self.initial = initial
        self.global_ = initial
        self.overrides: dict[str, dict[str, Any]] = {}  # model -> the settings it sets itself

    def effective(self, model: str) -> TraceSettings:
        own = self.overrides.get(model)
        return dataclasses.replace(self.global_, **own) if own else self.global_

    @property
    def any_on(self) -> bool:
        return self.global_.on or any(self.effective(m).on for m in self.overrides)

    def update(self, model: str, changes: dict[str, Any]) -> None:
        parsed = {name: None if value is None else parse_value(name, value) for name, value in changes.items()}
        if model:
            own = self.overrides.setdefault(model, {})
            for name, value in parsed.items():
                if value is None:
                    own.pop(name, None)
                else:
                    own[name] = value
            if not own:
                del self.overrides[model]
        else:
            reset = {n: getattr(self.initial, n) if v is None else v for n, v in parsed.items()}
            self.global_ = dataclasses.replace(self.global_, **reset)

    def take_count(self, model: str) -> None:
        """One trace taken: decrement the count of whichever setting applies (when limited)."""
        own = self.overrides.get(model)
        if own and "trace_count" in own:
            if own["trace_count"] > 0:
                own["trace_count"] -= 1
        elif self.global_.trace_count > 0:
            self.global_ = dataclasses.replace(self.global_, trace_count=self.global_.trace_count - 1)


def parse_trace_config(items: list[str]) -> TraceSettings:
    """``--trace-config rate=100``, ``level=TIMESTAMPS``, ``count=5``, ``triton,file=...``,
    ``triton,log-frequency=50`` (Triton's syntax) -> the settings at start."""
    names = {"rate": "trace_rate", "level": "trace_level", "count": "trace_count", "file": "trace_file",
             "log-frequency": "log_frequency"}
    values: dict[str, Any] = {}
    levels: list[str] = []
    for item in items:
        mode, _, setting = item.rpartition(",")
        key, sep, value = setting.partition("=")
        if not sep or key not in names or mode not in ("", "triton"):
            raise ValueError(f"unsupported --trace-config '{item}'")
        if key == "level":
            levels.append(value)
        else:
            values[names[key]] = parse_value(names[key], value)
    if levels:
        values["trace_level"] = parse_value("trace_level", levels)
    return TraceSettings(**values)
