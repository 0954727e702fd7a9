"""How a load applies: the lifecycle's state, each load handed to the repository agent
to prepare (``router/repository/prepare.py``, off the loop) and entered in the registry
when prepared, in place or staged beside the serving entry, and unloads, which cancel
the loads of their model still being prepared.

Loads of different models are prepared in parallel; those of one model one after the
other, in the order asked (``_preparing`` queues them), so calls are answered once the
model settles with the newest files. An unload bumps its model's epoch: a preparation
asked before it is dropped when it comes back.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from conveyor.proto import migration
from conveyor.proto.config_parameters import parameter_text
from conveyor.proto.errors import ConveyorError, Status, client_mistake
from conveyor.router.lifecycle import instance_update
from conveyor.router.lifecycle.entry_state import fully_serving, loading, problem_of, serving
from conveyor.router.lifecycle.instance_update import InstanceUpdate, needs_no_reload, same_but_version_policy
from conveyor.router.lifecycle.records import Answer, DeferredUnload, LoadWaiter, ModelControlConfig, Prep, Why
from conveyor.router.models import Instance, ModelEntry, without_shared
from conveyor.router.registry import ModelRegistry
from conveyor.router.repository.agent import Lane, RepositoryAgent, logged
from conveyor.router.repository.cloud.roots import UnusableRepository
from conveyor.router.repository.config_unused import log_unused_fields
from conveyor.router.repository.default_groups import filled_config
from conveyor.router.repository.prepare import (
    Prepared,
    Repositories,
    SpecSettings,
    failed_spec,
    prepare,
    remove_dir,
)
from conveyor.router.scheduling.engine_placement import EnginePlacement
from conveyor.router.scheduling.overload import OverloadLimits, limits_only_change
from conveyor.router.spec.model_spec import ModelSpec
from conveyor.router.spec.namespaces import name_of, step_key

log = logging.getLogger("conveyor.router.lifecycle")  # one name for all the lifecycle's log lines, as before


class ModelLoads:
    """The state every part of ``ModelLifecycle`` shares, and the loads' course."""

    def __init__(
        self,
        registry: ModelRegistry,
        repositories: list[str],
        control: ModelControlConfig | None = None,
        agent: RepositoryAgent | None = None,
        sync: Callable[[], None] | None = None,
        check: Callable[[], None] | None = None,
    ) -> None:
        """``repositories``: the local roots (remote ones' mirrors); ``control``: the model control settings
        (the loading half is read here); ``sync``: refreshes the remote repositories' mirrors (None: every
        repository is local); ``check``: raises ``UnusableRepository`` for a root the server cannot start
        with (run first at start-up, on the agent: it may list a bucket)."""
        control = control or ModelControlConfig()
        self.registry = registry
        # --model-namespacing: models are keyed as router/spec/namespaces.py says.
        self.namespacing = registry.namespacing = control.namespacing
        self.repositories = repositories
        self.mode = control.mode
        self.load_at_start = control.load_at_start
        self.strict_config = control.strict_config
        self.config_name = control.config_name  # --model-config-name
        self.unload_waits = control.unload_waits_for_load
        self._deferred: list[DeferredUnload] = []  # unloads waiting for their model's loads in progress
        self.backend_config = control.backend_config
        self.agent = agent or RepositoryAgent()
        self._sync = sync
        self._check = check
        # The root start-up's check refused (router/repository/cloud/roots.py): the router exits.
        self.unusable: UnusableRepository | None = None
        self._waiters: list[LoadWaiter] = []
        self._answers: list[Answer] = []  # replies ready for ``settle`` to hand out
        self._overrides: dict[str, str] = {}  # model -> directory written for a load with file overrides
        self._prints: dict[str, str] = {}  # model -> fingerprint of what is loaded
        # Repositories registered at run time (SageMaker's multi-model load), each with
        # its subdirectory -> model name mapping, as Triton's RegisterModelRepository.
        self._registered: dict[str, dict[str, str]] = {}
        # model -> the preparations waiting behind the one the agent runs for it (present while one runs)
        self._preparing: dict[str, deque[Prep]] = {}
        self._epochs: dict[str, int] = {}  # model -> unloads so far (see Prep.epoch)
        self._polling = False
        self._listing_at_start = False
        self._startup_left = 0  # start-up preparations not applied yet
        # Models entered in place whose versions have not all settled yet: once they have, a version that
        # failed unloads the others (``Settling._all_or_none``).
        self._fresh: set[str] = set()
        # Models whose last look failed Triton's poll (ModelSpec.poll_failed), with why: never added.
        self.poll_failures: dict[str, str] = {}
        # EXPLICIT mode's start-up: what the repositories held, where --load-model's ensembles find the models
        # they are made of (loaded with them); emptied once start-up settled.
        self._startup_disk: dict[str, str] = {}
        self.twice: frozenset[str] = frozenset()  # names several repositories hold, as last looked at
        # Models loaded by their own name (a load call, --load-model, any model in POLL or NONE mode) rather than
        # for an ensemble: an ensemble's unload with unload_dependents leaves them loaded.
        self._explicit: set[str] = set()
        # Models loaded with a config override, and their directory's fingerprint then: a load without one
        # keeps the override while the files are unchanged (Triton: the model is unmodified).
        self._override_prints: dict[str, str] = {}
        self._contents: dict[str, dict[str, str]] = {}  # model -> ``Prepared.content`` as loaded
        # Models whose instances a load changes in place (instance_update.py), until its call is answered.
        self._updating: dict[str, InstanceUpdate] = {}
        # Instances an update removed (or an undone update added), not yet unloaded: they go once idle.
        self._leaving: list[Instance] = []
        # Those an update removed that hold sequences: they serve them to their end, then leave.
        self._lingering: list[Instance] = []
        # Those unloaded, until their worker says they are closed (InstanceClosed): (model, version, index) ->
        # their worker. An update's call is answered once none of its removed instances is left here.
        self._closing: dict[tuple[str, str, int], bytes] = {}

    # --- what the agent is given ----------------------------------------------------------

    def _repos(self) -> Repositories:
        registered = {root: dict(mapping) for root, mapping in self._registered.items()}
        return Repositories(tuple(self.repositories), registered, self.namespacing, self._sync)

    def _settings(self) -> SpecSettings:
        return SpecSettings(not self.strict_config, self.config_name, self.backend_config, frozenset(self._registered))

    def _listing_lane(self) -> Lane:
        """A look that syncs remote mirrors first queues behind other syncs (one at a time)."""
        return Lane.SYNC if self._sync is not None else Lane.SCAN

    def _remove(self, path: str) -> None:
        self.agent.submit(Lane.SCAN, lambda: remove_dir(path), logged(f"removing {path}"))

    def remove_overrides(self) -> None:
        """At exit: the folders written for loads with file overrides still loaded (as Triton's go with it)."""
        for path in self._overrides.values():
            remove_dir(path)
        self._overrides.clear()

    # --- loads prepared and applied --------------------------------------------------------

    def _prepare(self, prep: Prep) -> None:
        """Have the agent prepare ``prep``: at once, or once the preparation of the same model
        that it runs is applied (so two loads of one model apply in the order asked)."""
        prep.epoch = self._epochs.get(prep.key, 0)
        if prep.waiter is not None:
            prep.waiter.keys.add(prep.key)
        if prep.why is Why.STARTUP:
            self._startup_left += 1
        queued = self._preparing.get(prep.key)
        if queued is not None:
            queued.append(prep)
            return
        self._preparing[prep.key] = deque()
        self._submit(prep)

    def _submit(self, prep: Prep) -> None:
        key, path, override, files, error, settings = (prep.key, prep.path, prep.override, prep.files, prep.error,
                                                       self._settings())
        self.agent.submit(Lane.LOAD, lambda: prepare(key, path, override, files, settings, error),
                          lambda outcome: self._prepared(prep, outcome))

    def _prepared(self, prep: Prep, outcome: Prepared | Exception) -> None:
        if prep.epoch != self._epochs.get(prep.key, 0):  # unloaded meanwhile: this load is cancelled
            log.info("model '%s': a load cancelled by an unload was prepared; dropped", prep.key)
            if isinstance(outcome, Prepared) and outcome.written:
                self._remove(outcome.written)
        elif isinstance(outcome, ConveyorError):  # the load's file overrides could not be written
            if prep.waiter is not None:
                self._fail(prep.waiter, outcome)
        elif isinstance(outcome, Exception):  # the directory went away while it was read, say
            self._apply(prep, Prepared(failed_spec(prep.key, prep.path, f"cannot be read: {outcome}"), ""))
        else:
            self._apply(prep, outcome)
        if prep.why is Why.STARTUP:
            self._startup_left -= 1
            if self._startup_left == 0:
                self._startup_disk = {}
        queued = self._preparing[prep.key]
        if queued:
            self._submit(queued.popleft())
        else:
            del self._preparing[prep.key]

    def _apply(self, prep: Prep, done: Prepared) -> None:
        """A prepared model enters the registry: in place, or staged beside the serving one."""
        registry, key, spec = self.registry, prep.key, done.spec
        if prep.why is Why.LOAD:
            old = self._overrides.pop(key, None)
            if old and old != done.written:
                self._remove(old)  # back to the repository's files, or newer ones: instances hold what they need
            if done.written:
                self._overrides[key] = done.written
        if prep.why is Why.LOAD and self._keeps_override(prep, done):
            return
        self._prints[key] = done.print
        content, self._contents[key] = self._contents.get(key), done.content
        if spec.poll_failed:
            self._poll_failed(prep, spec.error)
            return
        if not prep.composing and prep.why is not Why.COMPOSING:
            self._explicit.add(key)
        self.poll_failures.pop(key, None)
        if self._retuned(key, spec):
            return
        if content is not None and content == done.content and self._updated_in_place(key, spec):
            return
        entry = registry.build(spec)
        registry.unloaded.pop(key, None)
        previous = registry.staging.pop(key, None)
        if previous is not None:  # a newer load supersedes a reload still loading
            registry.retiring.append(without_shared(previous, registry.models.get(key)))
        kept: set[int] = set()
        if key in registry.models and not registry.models[key].spec.error and serving(registry.models[key]):
            if content is not None:
                kept = self._keep_unchanged_versions(registry.models[key], entry, content, done.content)
            registry.staging[key] = entry
        else:
            old_entry = registry.models.get(key)
            if old_entry is not None:
                registry.retiring.append(old_entry)
            registry.models[key] = entry
            registry.generation += 1
            self._fresh.add(key)
        if spec.error:
            log.error("model '%s' is not available: %s", key, spec.error)
        else:
            for version in sorted({*spec.versions, *spec.version_errors} - kept):
                log.info("loading: %s:%d", name_of(key), version)  # Triton's line per version it loads
            log_unused_fields(key, spec.config)
        if prep.waiter is not None and prep.waiter in self._waiters:
            self._load_composing(key, prep.waiter)
        elif prep.why is Why.STARTUP and self._startup_disk:
            self._load_composing_at_start(key)

    def _keeps_override(self, prep: Prep, done: Prepared) -> bool:
        """A load without a config of a model a config override loaded, whose files have not changed since:
        Triton finds the model unmodified and keeps it as it is. Any other load forgets the override."""
        key = prep.key
        if prep.override is not None or prep.files:
            if prep.files or done.spec.error:  # file overrides: the next load reloads (Triton's oldest mtime)
                self._override_prints.pop(key, None)
            else:
                self._override_prints[key] = done.print
            return False
        if self._override_prints.get(key) == done.print and key in self.registry.models:
            log.info("model '%s' is unmodified since its load with a config override: kept as loaded", key)
            return True
        self._override_prints.pop(key, None)
        return False

    def _poll_failed(self, prep: Prep, error: str) -> None:
        """Triton's poll failure: the model is not added (one that serves keeps serving, as it was), and a
        load call fails as Triton's does. The index still lists it with the reason (Triton's shows the name only)."""
        key = prep.key
        log.error("Poll failed for model directory '%s': %s", name_of(key), error)
        self.poll_failures[key] = error
        if prep.waiter is not None:  # Triton's words, and why (Triton says it in its log only)
            self._fail(prep.waiter, client_mistake(
                f"failed to load '{name_of(prep.waiter.name)}', failed to poll from model repository: {error}"))

    def _retuned(self, key: str, spec: ModelSpec) -> bool:
        """Apply ``spec`` in place when it changes only the serving entry's overload limits
        (``router/scheduling/overload.py``), ``ENGINE_PLACEMENT`` or ``MAX_MIGRATIONS``, every version of
        which serves: its instances, queues and requests stay as they are, and the next request is checked
        against the new limits, placed by the new rule, and moved (by an ingress) as often as the new bound says."""
        registry = self.registry
        current = registry.models.get(key)
        if (
            current is None or key in registry.staging or spec.error or problem_of(current)
            or current.spec.path != spec.path or current.spec.versions != spec.versions
        ):
            return False
        # Compared as the config endpoint shows them (instance groups named, the default group written
        # out): a client changes a limit by loading what it read there with the limit changed.
        latest = current.versions[max(current.versions)]
        if not limits_only_change(filled_config(current.spec.config, latest), filled_config(spec.config, latest)):
            return False
        current.spec = spec
        limits = OverloadLimits.from_config(spec.config)
        by_prefix = EnginePlacement.from_config(spec.config).by_prefix
        for state in current.versions.values():
            state.config, state.limits = spec.config, limits
            if state.placement is not None:
                state.placement.by_prefix = by_prefix  # its record kept: the engines' caches are
        registry.generation += 1  # the ingresses read the config again (the OpenAI one its MAX_MIGRATIONS)
        log.info("model '%s': new limits apply in place (MAX_WAITING_REQUESTS %s, MAX_KV_CACHE_USAGE %s, "
                 "ENGINE_PLACEMENT %s, MAX_MIGRATIONS %d)", key, limits.max_waiting or "unset",
                 limits.max_kv_usage or "unset", "prefix" if by_prefix else "round_robin",
                 migration.max_migrations_of(parameter_text(spec.config, migration.PARAMETER)))
        return True

    @staticmethod
    def _keep_unchanged_versions(current: ModelEntry, entry: ModelEntry, before: dict[str, str],
                                 now: dict[str, str]) -> set[int]:
        """Triton's per-version reload: when the files every version shares and the config (its version policy
        aside) are unchanged, a version of the reload whose own files are unchanged is the serving one, moved
        into the staged entry untouched (its instances, queue and statistics); the others load. Returns those."""
        if (current.spec.backend == "ensemble" or not fully_serving(current)
                or current.spec.path != entry.spec.path or before.get("") != now.get("")
                or not same_but_version_policy(current.spec.config, entry.spec.config)):
            return set()
        kept: set[int] = set()
        for v, state in entry.versions.items():
            old = current.versions.get(v)
            if (old is not None and old.ready and not state.error and before.get(str(v)) is not None
                    and before.get(str(v)) == now.get(str(v)) and current.spec.versions.get(v) == state.path):
                entry.versions[v] = old
                kept.add(v)
        return kept

    def _updated_in_place(self, key: str, spec: ModelSpec) -> bool:
        """Triton's instance update (instance_update.py): the model's files are unchanged but for a config
        that differs from the serving one in its instance groups at most, every version of which serves."""
        registry = self.registry
        current = registry.models.get(key)
        if (
            current is None or key in registry.staging or key in self._updating or spec.error
            or spec.backend == "ensemble" or spec.version_errors or current.spec.version_errors
            or not fully_serving(current)
            or current.spec.path != spec.path or current.spec.versions != spec.versions
            or not needs_no_reload(current.spec.config, spec.config)
        ):
            return False
        update = instance_update.begin(current, spec, registry.next_index)
        self._updating[key] = update
        registry.generation += 1  # the config endpoint shows the new groups
        added = sum(len(v.added) for v in update.versions)
        removed = sum(len(v.removed) for v in update.versions)
        log.info("model '%s': instances updated in place: %d added, %d removed, %d kept", name_of(key), added,
                 removed, sum(len(v.kept) for v in update.versions))
        return True

    def _load_composing(self, key: str, waiter: LoadWaiter) -> None:
        """An ensemble's composing models load with it (as in Triton), unless already loaded."""
        entry = self.registry.models.get(key) or self.registry.staging.get(key)
        if entry is None:
            return
        for step in entry.spec.config.ensemble_scheduling.step:
            model = step_key(entry.spec.path, step.model_name, self.registry.namespaced)
            if model in waiter.keys or model in self.registry.models:
                continue
            if model in self._preparing:  # on its way already (another load): the answer waits for it too
                waiter.keys.add(model)
            elif model in waiter.on_disk:
                self._prepare(Prep(model, waiter.on_disk[model], Why.COMPOSING, waiter=waiter))

    def _load_composing_at_start(self, key: str) -> None:
        """--load-model of an ensemble: its composing models load with it at start-up, as Triton's."""
        entry = self.registry.models.get(key)
        if entry is None:
            return
        for step in entry.spec.config.ensemble_scheduling.step:
            model = step_key(entry.spec.path, step.model_name, self.registry.namespaced)
            if model in self.registry.models or model in self._preparing or model not in self._startup_disk:
                continue
            self._prepare(Prep(model, self._startup_disk[model], Why.STARTUP, composing=True))

    def _unload(self, name: str) -> None:
        self._cancel(name)
        registry = self.registry
        override = self._overrides.pop(name, None)
        if override:
            self._remove(override)
        staged = registry.staging.pop(name, None)
        if staged is not None:
            registry.retiring.append(without_shared(staged, registry.models.get(name)))
        entry = registry.models.pop(name, None)
        if entry is not None:
            registry.retiring.append(entry)
        registry.unloaded[name] = "unloaded"
        self._prints.pop(name, None)
        self._contents.pop(name, None)
        self._updating.pop(name, None)  # its entry retires whole; instances it removed leave as planned
        self._lingering = [i for i in self._lingering if i.version.model != name]  # they retire with it
        self.poll_failures.pop(name, None)
        self._explicit.discard(name)
        self._override_prints.pop(name, None)
        registry.generation += 1

    def _load_in_flight(self, key: str) -> bool:
        """A load of ``key`` is being prepared, staged, updating instances in place or loading in place."""
        registry = self.registry
        current = registry.models.get(key)
        return (key in self._preparing or key in registry.staging or key in self._updating
                or (current is not None and loading(current)))

    def _apply_deferred(self) -> None:
        """Unloads waiting for loads in progress (``RepositoryCalls`` applies them)."""

    def _cancel(self, key: str) -> None:
        """No load of ``key`` asked for so far will apply: what is being prepared is dropped
        when it comes, what waits behind it is dropped now, and their calls are answered."""
        self._epochs[key] = self._epochs.get(key, 0) + 1
        queued = self._preparing.get(key)
        if queued:
            self._startup_left -= sum(1 for p in queued if p.why is Why.STARTUP)
            queued.clear()
        for waiter in [w for w in self._waiters if w.name == key or key in w.keys]:
            if self.unload_waits:  # tritonserver: what Triton answers a load an unload overtook
                self._fail(waiter, ConveyorError(
                    Status.INTERNAL, f"failed to load '{name_of(waiter.name)}', unexpected miss in global map"))
                continue
            self._fail(waiter, ConveyorError(
                Status.CANCELLED,
                f"failed to load '{name_of(waiter.name)}': '{name_of(key)}' was unloaded while it was loading"))

    def _fail(self, waiter: LoadWaiter, error: ConveyorError) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            self._answers.append(Answer(waiter.reply_to, error))

    def _keys(self, name: str, on_disk: dict[str, str]) -> list[str]:
        """The keys of the models named ``name`` on disk."""
        if name in on_disk:
            return [name]
        return [k for k in self.registry.namespaced.get(name, ()) if k in on_disk] or [
            k for k in on_disk if name_of(k) == name]
