"""What a model entry's versions say about it: loading, serving, or why not ready,
and the error a load call whose model settled so is answered with (Triton's words)."""

from __future__ import annotations

from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.models import ModelEntry

NO_VERSION = "no version is available"


def loading(entry: ModelEntry) -> bool:
    return not entry.spec.error and any(s.state == "LOADING" for s in entry.versions.values())


def serving(entry: ModelEntry) -> bool:
    return any(s.ready for s in entry.versions.values())


def problem_of(entry: ModelEntry) -> str:
    """Why a settled entry is not fully ready ('' if every version is)."""
    if entry.spec.error:
        return entry.spec.error
    if not entry.versions:
        return NO_VERSION
    # Triton's load tracker: one "version N is at STATE state: reason;" per version that failed.
    return "".join(f"version {s.label} is at UNAVAILABLE state: {s.reason};"
                   for s in entry.versions.values() if not s.ready)


def load_failed(name: str, problem: str) -> ConveyorError:
    if problem == NO_VERSION:
        return ConveyorError(Status.INVALID_ARG, f"failed to load '{name}', {problem}")
    if problem.startswith("version "):
        return ConveyorError(Status.INVALID_ARG, f"load failed for model '{name}': {problem}\n")
    return ConveyorError(Status.INVALID_ARG, f"failed to load '{name}': {problem}")
