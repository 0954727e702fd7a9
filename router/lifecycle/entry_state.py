"""What a model entry's versions say about it: loading, serving, or why not ready,
and the error a load call whose model settled so is answered with (Triton's words).

A load is settled once every instance of every version has loaded or failed, and it succeeded only if
all did (Triton loads a model's instances and versions all, or fails it): a version that serves with
one instance failed counts as failed here, though ``VersionState.ready`` (any instance ready) keeps it
serving when an instance fails later, on a worker that joined after the load."""

from __future__ import annotations

from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.models import UNLOADED, Instance, InstanceState, ModelEntry, VersionState

NO_VERSION = "no version is available"


def _settled(inst: Instance) -> bool:
    return inst.state in (InstanceState.READY, InstanceState.DRAINING, InstanceState.FAILED) or (
        inst.state is InstanceState.UNPLACED and bool(inst.error))


def loading(entry: ModelEntry) -> bool:
    return not entry.spec.error and any(
        s.state == "LOADING" or (not s.error and not all(_settled(i) for i in s.instances))
        for s in entry.versions.values())


def serving(entry: ModelEntry) -> bool:
    return any(s.ready for s in entry.versions.values())


def failure_of(state: VersionState) -> str:
    """Why a settled version failed its load ('' if it did not): its own reason, or an instance's."""
    if not state.ready:
        return state.reason
    for inst in state.instances:
        if inst.state is InstanceState.FAILED or (inst.state is InstanceState.UNPLACED and inst.error):
            return inst.error
    return ""


def problem_of(entry: ModelEntry) -> str:
    """Why a settled entry is not fully ready ('' if every version is)."""
    if entry.spec.error:
        return entry.spec.error
    if not entry.versions:
        return NO_VERSION
    # Triton's load tracker: one "version N is at STATE state: reason;" per version that failed.
    return "".join(f"version {s.label} is at UNAVAILABLE state: {failure};"
                   for s in entry.versions.values() for failure in [failure_of(s)] if failure)


def fully_serving(entry: ModelEntry) -> bool:
    """Settled, and every version serves but those a reload dropped (UNAVAILABLE "unloaded", kept for the index):
    a load may keep what serves (an instance update, a per-version reload)."""
    return (not entry.spec.error and not loading(entry) and any(s.ready for s in entry.versions.values())
            and all((s.ready and not failure_of(s)) or s.error == UNLOADED for s in entry.versions.values()))


def load_failed(name: str, problem: str) -> ConveyorError:
    if problem == NO_VERSION:
        return ConveyorError(Status.INVALID_ARG, f"failed to load '{name}', {problem}")
    if problem.startswith("version "):
        return ConveyorError(Status.INVALID_ARG, f"load failed for model '{name}': {problem}\n")
    return ConveyorError(Status.INVALID_ARG, f"failed to load '{name}': {problem}")
