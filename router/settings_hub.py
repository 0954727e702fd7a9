"""The group's runtime settings, kept in the router and pushed to every process.

Log settings (logging extension) apply to every process; trace settings stay
here (the router samples), and ingress processes only learn whether tracing is
on at all, so they stamp requests only then. Each ingress and worker gets a
``SettingsUpdate`` when it says hello and whenever a setting changes.

The log and trace file locations are start-up settings only (``proto/start_only.py``): a request
that sets one is refused here, before any of its settings is applied, whichever ingress it came by.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conveyor.deploy.runtime.log_settings import ProcessLog
from conveyor.proto import messages as m
from conveyor.proto.errors import invalid_arg
from conveyor.proto.start_only import refuse_log_file, refuse_trace_file
from conveyor.router.observability.trace_settings import TraceConfig, TraceSettingsStore


class SettingsHub:
    def __init__(self, trace: TraceConfig, broadcast: Callable[[bytes], None]) -> None:
        self.trace = TraceSettingsStore(trace.settings, trace.mode, trace.otel)
        self._broadcast = broadcast
        self.live = True  # false once the server failed to initialize (router/server.py)

    def message(self) -> bytes:
        return m.encode(m.SettingsUpdate(ProcessLog.settings.wire(), self.trace.any_on, self.live))

    def not_live(self) -> None:
        """The server failed to initialize: every ingress answers its liveness probes 'not live'."""
        self.live = False
        self._broadcast(self.message())

    def log_settings(self, settings: dict[str, Any] | None = None) -> dict[str, Any]:
        """GET (no ``settings``) or POST ``/v2/logging``: apply here, then everywhere."""
        if settings:
            refuse_log_file(settings)
            # As Triton: a null member leaves that setting as it is.
            changes = {name: value for name, value in settings.items() if value is not None}
            if changes:
                ProcessLog.apply(ProcessLog.settings.updated(changes))
                self._broadcast(self.message())
        return ProcessLog.settings.wire()

    def trace_settings(self, model: str = "", settings: dict[str, Any] | None = None,
                       known: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """GET or POST ``/v2[/models/{m}]/trace/setting``."""
        if model and known is not None and not known(model):
            raise invalid_arg(f"Request for unknown model : {model}")  # Triton's words: no quotes
        if settings:
            refuse_trace_file(settings)
            was_on = self.trace.any_on
            self.trace.update(model, settings)
            if self.trace.any_on != was_on:
                self._broadcast(self.message())
        return self.trace.wire(model)
