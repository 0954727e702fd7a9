"""Triton's rate limiter (``--rate-limit execution_count``): an instance runs a
batch only when the resources its ``instance_group { rate_limiter { ... } }``
lists are free; they are taken at dispatch and given back when the batch's
execution ends.

Rules, as in Triton's core (``rate_limiter.cc``):

* A resource is per device unless ``global: true``; a CPU instance counts as
  device 0, as Triton's do. One name cannot be both global and per device.
* How many of a resource exist: by default the largest count any registered
  instance asks for, so every instance can run. ``--rate-limit-resource
  name:count[:device]`` sets it instead (no device: every device; a global
  resource takes the largest value given for its name). Once any is given, a
  resource not given has 0 copies, and an instance needing more than exists
  fails to load: ``Resource count for "R" is limited to N which will prevent
  scheduling of one or more model instances, the minimum required count is M``.
* ``priority``: when resources come free, the versions waiting for them are
  served by their instances' ``(executions + 1) * priority`` (0 counts as 1),
  lowest first: priority 2 gets about half the turns of priority 1.

With ``--rate-limit off`` (the default) none of this exists: the router holds
no limiter and pays nothing.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, invalid_arg

if TYPE_CHECKING:
    from conveyor.router.models import Instance, VersionState

GLOBAL = -1  # the device key of global resources

log = logging.getLogger(__name__)
ALL_DEVICES = -2  # a --rate-limit-resource without a device

Key = tuple[int, str]  # (device or GLOBAL, resource name)


@dataclass(frozen=True, slots=True)
class ResourceLimit:
    """One ``--rate-limit-resource name:count[:device]``."""

    name: str
    count: int
    device: int = ALL_DEVICES

    @classmethod
    def parse(cls, text: str) -> ResourceLimit:
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3) or not parts[0]:
                raise ValueError
            count = int(parts[1])
            device = int(parts[2]) if len(parts) == 3 else ALL_DEVICES
            if count < 0 or (len(parts) == 3 and device < 0):
                raise ValueError
        except ValueError:
            raise ValueError(f"expected <name>:<count>[:<device>], got '{text}'") from None
        return cls(parts[0], count, device)


def device_index(device: str) -> int:
    """``cuda:N`` -> N; a CPU instance is device 0, as in Triton."""
    return int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0


def instance_limiters(config: mc.ModelConfig) -> list[mc.ModelRateLimiter]:
    """One ``rate_limiter`` per instance, in the order ``instance_devices`` lists them."""
    out: list[mc.ModelRateLimiter] = []
    for group in config.instance_group:
        count = group.count if group.count > 0 else 1
        devices = (len(group.gpus) or 1) if group.kind == mc.ModelInstanceGroup.KIND_GPU else 1
        out += [group.rate_limiter] * (count * devices)
    return out


@dataclass(slots=True)
class _Needs:
    resources: dict[Key, int]
    priority: int
    executions: int = 0

    @property
    def turn(self) -> int:
        return (self.executions + 1) * self.priority


class RateLimiter:
    def __init__(self, explicit: list[ResourceLimit]) -> None:
        self.explicit = explicit
        self._needs: dict[Instance, _Needs] = {}
        self._limits: dict[Key, int] = {}
        self._taken: dict[Key, int] = defaultdict(int)
        self._waiting: dict[VersionState, None] = {}  # versions with work that found no free resources

    # --- membership (instance placement and unload) -------------------------------------

    def register(self, inst: Instance) -> None:
        """Add ``inst``'s needs; raises INVALID_ARG (its load fails) when they can never be met."""
        if inst in self._needs:
            return
        version = inst.version
        if inst.signature:  # matched by an instance update: its group travels with it, its place says nothing
            config = mc.ModelInstanceGroup.FromString(inst.signature).rate_limiter
        else:
            limiters = instance_limiters(version.config)
            position = version.instances.index(inst)
            config = limiters[position] if position < len(limiters) else mc.ModelRateLimiter()
        device = device_index(inst.load_device)
        needs: dict[Key, int] = {}
        for r in config.resources:
            key = (GLOBAL if getattr(r, "global") else device, r.name)
            needs[key] = needs.get(key, 0) + r.count
        self._needs[inst] = _Needs(needs, config.priority or 1)
        try:
            self._set_limits(self._compute_limits())
        except ConveyorError:
            del self._needs[inst]
            raise

    def unregister(self, inst: Instance) -> None:
        if self._needs.pop(inst, None) is not None:
            self._set_limits(self._compute_limits())

    def _set_limits(self, limits: dict[Key, int]) -> None:
        """New limits, and Triton's verbose map of them when they change (its ParseAndValidateResources
        line, escaped as Triton's log escapes a message: L0_model_update greps it)."""
        changed = limits != self._limits
        self._limits = limits
        if changed and limits and log.isEnabledFor(logging.DEBUG):
            text = "\nMax Resource Map===>\n"
            for device in sorted({d for d, _ in limits}):
                text += f"\tDevice: {'GLOBAL' if device == GLOBAL else device}\n"
                text += "".join(f"\t\tResource: {name}\t Count: {count}\n"
                                for (d, name), count in sorted(limits.items()) if d == device)
            log.debug("%s", json.dumps(text))

    def _compute_limits(self) -> dict[Key, int]:
        required: dict[Key, int] = {}
        for needs in self._needs.values():
            for key, count in needs.resources.items():
                required[key] = max(required.get(key, 0), count)
        names: dict[str, bool] = {}
        for device, name in required:
            if names.setdefault(name, device == GLOBAL) != (device == GLOBAL):
                raise invalid_arg(
                    f'Resource "{name}" is present as both global and device-specific resource in the model '
                    "configuration."
                )
        if not self.explicit:
            return required
        limits: dict[Key, int] = {}
        for (device, name), need in required.items():
            given = [
                e.count for e in self.explicit
                if e.name == name and (device == GLOBAL or e.device in (device, ALL_DEVICES))
            ]
            count = max(given, default=0)
            if count < need:
                raise invalid_arg(
                    f'Resource count for "{name}" is limited to {count} which will prevent scheduling of one or '
                    f"more model instances, the minimum required count is {need}"
                )
            limits[(device, name)] = count
        return limits

    # --- the router loop ------------------------------------------------------------------

    def free(self, inst: Instance) -> bool:
        """Whether ``inst`` could start an execution now."""
        needs = self._needs.get(inst)
        if needs is None or not needs.resources:
            return True
        taken, limits = self._taken, self._limits
        return all(taken[key] + count <= limits.get(key, 0) for key, count in needs.resources.items())

    def acquire(self, inst: Instance) -> None:
        needs = self._needs.get(inst)
        if needs is None:
            return
        needs.executions += 1
        for key, count in needs.resources.items():
            self._taken[key] += count

    def release(self, inst: Instance) -> None:
        needs = self._needs.get(inst)
        if needs is None:
            return
        for key, count in needs.resources.items():
            self._taken[key] -= count

    def wait(self, state: VersionState) -> None:
        """``state`` has queued work and a free instance, but not the resources to run it."""
        self._waiting[state] = None

    def take_waiting(self) -> list[VersionState]:
        """The versions waiting for resources, best turn first; they leave the wait list
        (a version still blocked calls ``wait`` again)."""
        if not self._waiting:
            return []
        waiting = list(self._waiting)
        self._waiting.clear()
        return sorted(waiting, key=self._best_turn)

    def _best_turn(self, state: VersionState) -> int:
        turns = [n.turn for i in state.instances if (n := self._needs.get(i)) is not None]
        return min(turns, default=0)
