"""Triton's instance update: a load whose files are unchanged but for a config that differs only in
``instance_group`` (or ``version_policy`` with the same versions) changes the serving model's instances in
place (core's ``ConfigChangeRequiresReload`` false, ``TritonModel::UpdateInstanceGroup``). The instances the
new groups ask for that an old one matches (the same group settings but ``name`` and ``count``, on the same
device: Triton's ``InstanceConfigSignature``) stay untouched; the others are added, and once every added one
is ready the unmatched old ones leave: no new batch, unloaded (their ``finalize``) when their running batches
are done. The load call is answered once the last of them is closed. An added instance that fails undoes the
update: the added ones are unloaded, the old ones keep serving as they were, and the call fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from conveyor.proto import model_config_pb2 as mc
from conveyor.router.models import Instance, InstanceState, ModelEntry, VersionState, instance_devices, instance_names
from conveyor.router.scheduling.sequences import SequenceBatcher
from conveyor.router.spec.model_spec import ModelSpec
from conveyor.router.spec.triton_rules import default_count


def needs_no_reload(old: mc.ModelConfig, new: mc.ModelConfig) -> bool:
    """Core's ConfigChangeRequiresReload, false: the configs differ in ``instance_group`` and
    ``version_policy`` at most. Both name their groups (a model without one has an instance per worker, and
    KIND_AUTO is resolved by placement: those reload)."""
    if not old.instance_group or not new.instance_group:
        return False
    if any(g.kind == mc.ModelInstanceGroup.KIND_AUTO for c in (old, new) for g in c.instance_group):
        return False
    a, b = mc.ModelConfig(), mc.ModelConfig()
    a.CopyFrom(old)
    b.CopyFrom(new)
    for c in (a, b):
        c.ClearField("instance_group")
        c.ClearField("version_policy")
    return a == b


def same_but_version_policy(old: mc.ModelConfig, new: mc.ModelConfig) -> bool:
    """The configs differ in ``version_policy`` at most: a reload keeps the versions whose files are unchanged."""
    a, b = mc.ModelConfig(), mc.ModelConfig()
    a.CopyFrom(old)
    b.CopyFrom(new)
    a.ClearField("version_policy")
    b.ClearField("version_policy")
    return a == b


def _signatures(config: mc.ModelConfig) -> list[bytes]:
    """One per instance ``instance_devices`` lists, in its order: the group's settings but its name and count
    (core's InstanceConfigSignature); the device is compared beside it."""
    out: list[bytes] = []
    for group in config.instance_group:
        normal = mc.ModelInstanceGroup()
        normal.CopyFrom(group)
        normal.name, normal.count = "[Normalized]", 1
        count = group.count if group.count > 0 else default_count(group.kind, config.backend)  # as instance_devices
        on_gpus = group.kind == mc.ModelInstanceGroup.KIND_GPU and group.gpus
        out += [normal.SerializeToString(deterministic=True)] * (count * (len(group.gpus) if on_gpus else 1))
    return out


@dataclass(eq=False)
class VersionUpdate:
    state: VersionState
    old_config: mc.ModelConfig
    kept: list[Instance]
    added: list[Instance]
    removed: list[Instance]


@dataclass(eq=False)
class InstanceUpdate:
    """One model's update in place, from its start until its load call is answered."""

    entry: ModelEntry
    old_spec: ModelSpec
    versions: list[VersionUpdate]
    committed: bool = False  # every added instance is ready: the removed ones are leaving
    gone: list[Instance] = field(default_factory=list)  # removed ones leaving now: the call waits for them
    error: str = ""  # why the update was undone ("" it was not)

    def adding(self) -> bool:
        """An added instance has not settled yet."""
        return any(i.state in (InstanceState.LOADING, InstanceState.UNPLACED) and not i.error
                   for v in self.versions for i in v.added)

    def failure(self) -> str:
        for v in self.versions:
            for inst in v.added:
                if inst.state is InstanceState.FAILED or (inst.state is InstanceState.UNPLACED and inst.error):
                    return f"version {v.state.label} is at READY state: {inst.error};"
        return ""


def begin(entry: ModelEntry, spec: ModelSpec, next_index: Callable[[], int]) -> InstanceUpdate:
    """Match the new config's instances to the serving ones, version by version, and add the missing ones
    (unplaced: placement loads them). ``next_index`` numbers new instances (the registry's)."""
    update = InstanceUpdate(entry, entry.spec, [])
    config = spec.config
    wanted = list(zip(instance_devices(config), instance_names(config), _signatures(config), strict=True))
    for state in entry.versions.values():
        if state.error:  # a version a reload dropped, listed "unloaded": nothing runs
            continue
        if any(not i.signature for i in state.instances):  # never updated: in the order its config lists them
            for inst, sig in zip(state.instances, _signatures(state.config), strict=False):
                inst.signature = inst.signature or sig
        by_device: dict[tuple[str, bytes], list[Instance]] = {}
        batcher = state.batcher
        # Kept first: an instance holding sequences, so that fewer removed ones linger until their sequences end.
        holders = sorted(state.instances, key=lambda i: not batcher.holds(i)) if isinstance(
            batcher, SequenceBatcher) else state.instances
        for inst in holders:  # failed ones are replaced, as Triton makes them anew
            if inst.state is not InstanceState.FAILED and not (inst.state is InstanceState.UNPLACED and inst.error):
                by_device.setdefault((inst.device, inst.signature), []).append(inst)
        kept: list[Instance] = []
        added: list[Instance] = []
        for device, name, sig in wanted:
            matches = by_device.get((device, sig))
            if matches:
                kept.append(matches.pop(0))  # a renamed group's instance stays as it is, its name too
            else:
                added.append(Instance(state, next_index(), device, name=name, signature=sig))
        removed = [i for i in state.instances if i not in kept]
        update.versions.append(VersionUpdate(state, state.config, kept, added, removed))
        state.instances = state.instances + added  # the old ones serve on while the new ones load
        state.config = config
    entry.spec = spec
    return update


def commit(update: InstanceUpdate) -> tuple[list[Instance], list[Instance]]:
    """Every added instance is ready: the removed ones take no more batches. Returns those to unload now,
    and those that stay until the sequences they hold end (Triton's removed sequence instances)."""
    update.committed = True
    lingering: list[Instance] = []
    for v in update.versions:
        batcher = v.state.batcher
        if isinstance(batcher, SequenceBatcher):
            lingering += [i for i in v.removed if batcher.retire(i)]
        v.state.instances = [i for i in v.state.instances if i not in v.removed or i in lingering]
        update.gone += [i for i in v.removed if i not in lingering]
    return update.gone, lingering


def undo(update: InstanceUpdate) -> list[Instance]:
    """An added instance failed: the model serves as before. Returns the added instances, to unload."""
    gone: list[Instance] = []
    for v in update.versions:
        v.state.instances = [i for i in v.state.instances if i not in v.added]
        v.state.config = v.old_config
        gone += v.added
    update.entry.spec = update.old_spec
    return gone
