"""Triton's trace settings (trace extension): global ones plus per-model overrides.

Values travel as strings (a list of strings for ``trace_level``), as Triton's
``$trace_setting_response`` has them. A model setting given as null goes back to
the global one; a global one given as null goes back to its value at start.

The trace mode (``triton``: the trace file; ``opentelemetry``: OTLP export, see
``router/observability/otel_options.py``) is global and set at start only, as in Triton; the
responses show it as ``trace_mode``, and in OpenTelemetry mode show the exporter's
settings instead of ``trace_file`` and ``log_frequency``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from conveyor.proto.errors import invalid_arg
from conveyor.router.observability.otel_options import OtelOptions, parse_otel_setting

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")


@dataclass(frozen=True)
class TraceSettings:
    trace_file: str = ""
    trace_level: tuple[str, ...] = ("OFF",)
    trace_rate: int = 1000  # every Nth request is traced; 0: only those with a propagated context
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
        levels = [value] if isinstance(value, str) else value
        # A client's JSON may hold anything here (a number, an object): refused as the wrong names are.
        if not isinstance(levels, list) or not levels or any(v not in LEVELS for v in levels):
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
        # trace_rate 0: no sampling by rate, only requests with a propagated context (OpenTelemetry mode).
        if number < (-1 if name == "trace_count" else 0):
            raise invalid_arg(f"{name} {number} is out of range")
        return number
    raise invalid_arg(f"trace setting '{name}' is not supported")


@dataclass(frozen=True)
class TraceConfig:
    """Everything ``--trace-config`` sets: the settings at start, the mode, the OTLP exporter's options."""

    settings: TraceSettings = field(default_factory=TraceSettings)
    mode: str = "triton"
    otel: OtelOptions = field(default_factory=OtelOptions)

    @property
    def opentelemetry(self) -> bool:
        return self.mode == "opentelemetry"


class TraceSettingsStore:
    """The one place the group's trace settings live (the router)."""

    def __init__(self, initial: TraceSettings, mode: str = "triton", otel: OtelOptions | None = None) -> None:
        self.initial = initial
        self.global_ = initial
        self.overrides: dict[str, dict[str, Any]] = {}  # model -> the settings it sets itself
        self.mode = mode
        self.otel = otel or OtelOptions()

    @property
    def opentelemetry(self) -> bool:
        return self.mode == "opentelemetry"

    def wire(self, model: str = "") -> dict[str, Any]:
        """The settings that apply to ``model`` (or the global ones), as the trace extension answers."""
        doc = self.effective(model).wire()
        doc.update(self._fixed())
        if self.opentelemetry:  # as Triton: the file settings mean nothing in this mode
            del doc["trace_file"], doc["log_frequency"]
        return doc

    def _fixed(self) -> dict[str, Any]:
        """What only ``--trace-config`` sets: shown, never changed through the protocol."""
        fixed: dict[str, Any] = {"trace_mode": self.mode}
        if self.opentelemetry:
            fixed.update(self.otel.wire())
        return fixed

    def _drop_fixed(self, changes: dict[str, Any]) -> dict[str, Any]:
        """``changes`` without the start-only settings; a client may send them back unchanged
        (a GET posted again), any other value is refused."""
        fixed = self._fixed()
        kept = {}
        for name, value in changes.items():
            if name not in fixed:
                kept[name] = value
                continue
            same = value == fixed[name] or (isinstance(value, list) and [fixed[name]] == value)
            if not same:
                raise invalid_arg(f"'{name}' is set at start (--trace-config) and cannot be changed "
                                  "through the trace protocol")
        return kept

    def effective(self, model: str) -> TraceSettings:
        own = self.overrides.get(model)
        return dataclasses.replace(self.global_, **own) if own else self.global_

    def may_trace(self, settings: TraceSettings) -> bool:
        """Whether a request under ``settings`` can be traced: by rate and count, or (OpenTelemetry
        mode) because it carries a propagated context, which Triton traces whatever the count."""
        return settings.on or (self.opentelemetry and settings.trace_level != ("OFF",))

    @property
    def any_on(self) -> bool:
        """Whether ingress processes stamp requests (the router decides which are traced)."""
        return self.may_trace(self.global_) or any(self.may_trace(self.effective(m)) for m in self.overrides)

    def update(self, model: str, changes: dict[str, Any]) -> None:
        changes = self._drop_fixed(changes)
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


def parse_trace_config(items: list[str]) -> TraceConfig:
    """``--trace-config`` items (Triton's syntax) -> the configuration at start.

    Global: ``rate=N``, ``level=OFF|TIMESTAMPS|TENSORS`` (repeatable), ``count=N``,
    ``mode=triton|opentelemetry``. Per mode: ``triton,file=PATH``, ``triton,log-frequency=N``;
    ``opentelemetry,url=HOST:PORT/PATH``, ``opentelemetry,resource=KEY=VALUE`` (repeatable),
    ``opentelemetry,bsp_max_queue_size=N``, ``opentelemetry,bsp_schedule_delay=MS``,
    ``opentelemetry,bsp_max_export_batch_size=N``.
    """
    names = {"rate": "trace_rate", "level": "trace_level", "count": "trace_count", "file": "trace_file",
             "log-frequency": "log_frequency"}
    values: dict[str, Any] = {}
    levels: list[str] = []
    mode = "triton"
    otel: list[tuple[str, str]] = []
    for item in items:
        # The first comma ends the mode ("opentelemetry,resource=a=b,c" keeps its value whole).
        head, comma, rest = item.partition(",")
        scope, setting = (head, rest) if comma and head in MODES else ("", item)
        key, sep, value = setting.partition("=")
        if not sep:
            raise ValueError(f"unsupported --trace-config '{item}'")
        if scope == "opentelemetry":
            otel.append((key, value))
        elif key == "mode" and not scope:
            if value.lower() not in MODES:
                raise ValueError(f"trace mode must be one of {', '.join(MODES)}, got '{value}'")
            mode = value.lower()
        elif key in names and scope in ("", "triton"):
            if key == "level":
                levels.append(value)
            else:
                values[names[key]] = parse_value(names[key], value)
        else:
            raise ValueError(f"unsupported --trace-config '{item}'")
    if levels:
        values["trace_level"] = parse_value("trace_level", levels)
    return TraceConfig(TraceSettings(**values), mode, parse_otel_setting(otel))
