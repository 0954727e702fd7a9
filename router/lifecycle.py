"""Model lifecycle: Triton's model control modes, load / unload / reload, and
repository polling.

Reload without loss: a model that is already serving is reloaded into
``registry.staging``; its old entry keeps serving until every new version is
READY, then the two swap and the old entry retires (it finishes its queued and
running requests, then its instances are unloaded). A reload that fails leaves
the old model serving, as Triton documents. A model that was not serving loads
in place. ``settle`` is called after every event that can change an instance's
state and returns what the router must do: answer waiting calls, unload
instances.

This runs on the router's loop, so nothing here waits on a disk, a network or a child
process. What does (listing and mirroring the repositories, reading a model and
completing its config, fingerprinting its files) is asked of the repository agent
(``router/repository/agent.py`` runs ``router/repository/prepare.py``), and its results
are applied here when they come back. So:

- loads of different models are prepared in parallel, on ``--model-load-thread-count``
  threads, while every other model keeps serving;
- the loads of one model are prepared one after the other, in the order asked: a second
  load of a model waits for the first's preparation, and the calls are answered once the
  model settles with the newest files;
- an unload is applied at once; a load of that model still being prepared is cancelled
  (its result is dropped when it comes) and its call answered CANCELLED.
"""

from __future__ import annotations

import enum
import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status, client_mistake, invalid_arg
from conveyor.router.models import Instance, ModelEntry, ModelRegistry
from conveyor.router.repository.agent import Lane, RepositoryAgent, logged
from conveyor.router.repository.backend_config import BackendConfig
from conveyor.router.repository.config_unused import log_unused_fields
from conveyor.router.repository.namespaces import assign_keys, duplicated, name_of, step_key
from conveyor.router.repository.prepare import (
    Listing,
    Prepared,
    Repositories,
    SpecSettings,
    failed_spec,
    listing,
    on_disk,
    prepare,
    registration_check,
    remove_dir,
)

log = logging.getLogger(__name__)


def check_model_name(name: str) -> None:
    """Triton's ValidateModelName, checked on load only (an unload of such a name finds nothing)."""
    trimmed = name.strip(" \t\n\r\f\v")
    if not trimmed:
        raise invalid_arg("Model name cannot be empty. Please enter a valid name to deploy.")
    if trimmed == ".." or "/" in trimmed:
        raise invalid_arg(f"invalid model name '{name}', model name must not contain path traversal characters")


class ControlMode(enum.Enum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


@dataclass(eq=False)
class LoadWaiter:
    """A load call to answer once its model has settled (``reply_to``: an opaque handle of the router's)."""

    name: str  # the registry key its answer is about (the name asked, until the repository was looked at)
    reply_to: Any
    resolved: bool = False  # the repository was looked at: the keys it loads are known
    keys: set[str] = field(default_factory=set)  # every model whose preparation the answer waits for
    on_disk: dict[str, str] = field(default_factory=dict)  # what it found: its ensemble's composing models


@dataclass(slots=True)
class Answer:
    """A reply to a call the router answers later: an error, or a result (None: an empty reply)."""

    reply_to: Any
    error: ConveyorError | None = None
    result: Any = None


@dataclass
class Settled:
    answers: list[Answer] = field(default_factory=list)
    unload: list[Instance] = field(default_factory=list)


class Why(enum.Enum):
    STARTUP = "startup"
    POLL = "poll"
    LOAD = "load"
    COMPOSING = "composing"  # an ensemble's composing model, loaded with it


@dataclass(eq=False)
class Prep:
    """A model's load to be prepared by the agent, as the loop asked for it."""

    key: str
    path: str  # the model directory ("" when ``files`` are written into one of its own)
    why: Why
    override: mc.ModelConfig | None = None
    files: dict[str, bytes] | None = None
    waiter: LoadWaiter | None = None
    error: str = ""  # known unavailable already (a name two repositories hold): only fingerprinted
    epoch: int = 0  # the model's epoch when asked: an unload since makes the result stale


class ModelLifecycle:
    def __init__(
        self,
        registry: ModelRegistry,
        repositories: list[str],
        mode: ControlMode = ControlMode.NONE,
        load_at_start: list[str] | None = None,
        strict_config: bool = False,
        config_name: str = "",
        backend_config: BackendConfig | None = None,
        namespacing: bool = False,
        agent: RepositoryAgent | None = None,
        sync: Callable[[], None] | None = None,
    ) -> None:
        """``sync``: refreshes the remote repositories' mirrors (None: every repository is local)."""
        self.registry = registry
        # --model-namespacing: models are keyed as router/repository/namespaces.py says.
        self.namespacing = registry.namespacing = namespacing
        self.repositories = repositories
        self.mode = mode
        self.load_at_start = load_at_start or []
        self.strict_config = strict_config
        self.config_name = config_name  # --model-config-name
        self.backend_config = backend_config or BackendConfig()
        self.agent = agent or RepositoryAgent()
        self._sync = sync
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

    # --- start-up and polling ---------------------------------------------------------

    @property
    def starting(self) -> bool:
        """Start-up's models are not all read and entered yet: the server is not ready (then their
        versions' states say, as their instances load on the workers)."""
        return self._listing_at_start or self._startup_left > 0

    def startup(self) -> None:
        """Start-up's loads, waited for (tests and tools; the router's loop calls ``begin_startup``)."""
        self.begin_startup()
        self.agent.wait()

    def begin_startup(self) -> None:
        self._listing_at_start = True
        repos = self._repos()
        self.agent.submit(self._listing_lane(), lambda: listing(repos, sync=True, quiet=False),
                          self._listed_at_start)

    def _listed_at_start(self, outcome: Listing | Exception) -> None:
        self._listing_at_start = False
        if isinstance(outcome, Exception):
            log.error("cannot read the model repositories: %s", outcome)
            return
        names = outcome.on_disk
        if self.namespacing:
            self.registry.namespaced = duplicated(names)
        if self.mode is ControlMode.EXPLICIT and "*" not in self.load_at_start:
            for name in self.load_at_start:
                keys = self._keys(name, names)
                if not keys:
                    log.error("--load-model %s: no such model in the repositories", name)
                for key in keys:
                    self._prepare(Prep(key, names[key], Why.STARTUP))
            return
        if self.namespacing:
            for key, path in assign_keys(outcome.dirs).items():
                self._prepare(Prep(key, path, Why.STARTUP))
            return
        first: dict[str, str] = {}
        twice: set[str] = set()
        for entry, path in outcome.dirs:
            if entry in first:
                twice.add(entry)
            else:
                first[entry] = path
        for entry, path in first.items():
            error = f"model '{entry}' appears in more than one model repository" if entry in twice else ""
            self._prepare(Prep(entry, path, Why.STARTUP, error=error))

    def startup_outcome(self) -> str | None:
        """After start-up: None while a model still loads, else why not every model is ready
        ('' when all are): what --exit-on-error decides on."""
        if self.starting:
            return None
        problems = []
        for name, entry in sorted(self.registry.models.items()):
            if _loading(entry):
                return None
            problem = _problem(entry)
            if problem:
                problems.append(f"failed to load '{name}': {problem}")
        for name in self.load_at_start:
            if name != "*" and name not in self.registry.models and name not in self.registry.namespaced:
                problems.append(f"failed to load '{name}': no such model in the repositories")
        return "; ".join(problems)

    def poll(self) -> None:
        """One poll, waited for (tests and tools; the router's loop calls ``begin_poll``)."""
        self.begin_poll()
        self.agent.wait()

    def begin_poll(self) -> None:
        """POLL mode: look at the repositories; then load new and changed models, unload removed ones."""
        if self._polling or self.starting:
            return  # the next tick asks again
        self._polling = True
        repos = self._repos()
        self.agent.submit(self._listing_lane(), lambda: listing(repos, sync=True, prints=True), self._polled)

    def _polled(self, outcome: Listing | Exception) -> None:
        self._polling = False
        if isinstance(outcome, Exception):
            log.error("polling the model repositories failed: %s", outcome)
            return
        names = outcome.on_disk
        if self.namespacing:
            namespaced = duplicated(names)
            if namespaced != self.registry.namespaced:
                # Keys changed: ensembles resolve their steps again (they do on being built).
                self.registry.namespaced = namespaced
                for key, entry in self.registry.models.items():
                    if entry.spec.backend == "ensemble":
                        self._prints.pop(key, None)
        for name, path in sorted(names.items()):
            if (self._prints.get(name) != outcome.prints.get(name) and name not in self.registry.staging
                    and name not in self._preparing):
                log.info("model '%s' changed on disk: reloading", name)
                self._prepare(Prep(name, path, Why.POLL))
        for name in list(self.registry.models):
            if name not in names:
                log.info("model '%s' left the repository: unloading", name)
                self._unload(name)

    # --- the model repository extension ----------------------------------------------

    def check_control_allowed(self) -> None:
        if self.mode is not ControlMode.EXPLICIT:
            # Triton's words, whatever the mode (NONE too); --model-control-mode=explicit allows it.
            raise ConveyorError(Status.UNAVAILABLE, "explicit model load / unload is not allowed if polling is enabled")

    def load(self, name: str, reply_to: Any, config_json: str = "", files: dict[str, bytes] | None = None) -> None:
        """Start loading ``name``; ``reply_to`` is answered from ``settle`` once it settled. What is
        wrong with the call itself is raised at once."""
        self.check_control_allowed()
        check_model_name(name)
        if files and not config_json:
            raise invalid_arg(f"failed to load '{name}': file overrides ('file:' parameters) need a 'config' too")
        override = None
        if config_json:
            override = mc.ModelConfig()
            try:
                json_format.Parse(config_json, override)
            except json_format.ParseError as exc:
                # Triton logs the parse error and answers its poll failure (500 / INTERNAL, its status by default).
                log.error("failed to poll model '%s': the 'config' parameter: %s", name, exc)
                raise client_mistake(f"failed to load '{name}', failed to poll from model repository") from None
        waiter = LoadWaiter(name, reply_to)
        self._waiters.append(waiter)
        repos = self._repos()
        # As Triton, a load looks at the repository afresh: remote ones are mirrored again first.
        self.agent.submit(self._listing_lane(), lambda: listing(repos, sync=True).on_disk,
                          lambda outcome: self._resolved(waiter, override, files, outcome))

    def _resolved(self, waiter: LoadWaiter, override: mc.ModelConfig | None, files: dict[str, bytes] | None,
                  outcome: dict[str, str] | Exception) -> None:
        if waiter not in self._waiters:
            return  # answered meanwhile: an unload of that name
        name = waiter.name
        if isinstance(outcome, Exception):
            log.error("failed to poll model '%s': %s", name, outcome)
            self._fail(waiter, client_mistake(f"failed to load '{name}', failed to poll from model repository"))
            return
        # With --model-namespacing a name several repositories hold loads from each (as Triton).
        keys = self._keys(name, outcome) or [name]
        key = keys[0]
        if not files and key not in outcome:
            # Triton's INTERNAL (500) for a model its repository does not hold (400 with --client-mistakes-as-400).
            self._fail(waiter, client_mistake(f"failed to load '{name}', failed to poll from model repository"))
            return
        waiter.name, waiter.on_disk, waiter.resolved = key, outcome, True
        self._prepare(Prep(key, "" if files else outcome[key], Why.LOAD, override, files or None, waiter))
        for other in keys[1:]:  # each preparation reads its own copy, on its own thread
            copy = None if override is None else mc.ModelConfig.FromString(override.SerializeToString())
            self._prepare(Prep(other, outcome[other], Why.LOAD, copy, None, waiter))

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

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        self.check_control_allowed()
        if unload_dependents:
            for dependent in self._ensembles_using(name):
                self._unload(dependent)
        for key in [name, *self.registry.namespaced.get(name, ())]:
            if key in self.registry.models or key in self.registry.staging or key in self._preparing:
                self._unload(key)  # listed as unloaded, as after Triton's load then unload
            else:
                self._cancel(key)  # a load whose look at the repository has not come back
        # as Triton: unloading what is not loaded succeeds

    def _ensembles_using(self, name: str) -> list[str]:
        return [
            ensemble for ensemble, entry in self.registry.models.items()
            if any(step.model_name == name for step in entry.spec.config.ensemble_scheduling.step)
        ]

    def request_index(self, ready_only: bool, reply_to: Any) -> None:
        """The repository index, answered once the agent has looked at the repositories."""
        repos = self._repos()

        def indexed(outcome: dict[str, str] | Exception) -> None:
            if isinstance(outcome, Exception):
                error = ConveyorError(Status.INTERNAL, f"failed to read the model repositories: {outcome}")
                self._answers.append(Answer(reply_to, error))
            else:
                self._answers.append(Answer(reply_to, result=self.index_rows(ready_only, outcome)))

        self.agent.submit(Lane.SCAN, lambda: on_disk(repos), indexed)

    def index(self, ready_only: bool) -> list[dict[str, Any]]:
        """The index, reading the repositories in the caller's thread (tests and tools)."""
        return self.index_rows(ready_only, on_disk(self._repos()))

    def index_rows(self, ready_only: bool, found: dict[str, str]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        keys = set(found) | set(self.registry.models) | set(self.registry.unloaded)

        def order(key: str) -> tuple[str, str]:
            """By name, as Triton; with --model-namespacing by repository, then name (Triton's
            (namespace, name) order), a name several repositories hold once for each."""
            if not self.namespacing:
                return "", key
            entry = self.registry.models.get(key)
            path = found.get(key) or (entry.spec.path if entry is not None else key)
            return os.path.dirname(path), name_of(key)

        for key in sorted(keys, key=order):
            name = name_of(key)
            entry = self.registry.models.get(key)
            if entry is None:
                if not ready_only:
                    reason = self.registry.unloaded.get(key, "")
                    rows.append({"name": name, "version": "", "state": "UNAVAILABLE" if reason else "",
                                 "reason": reason})
                continue
            if entry.spec.error:
                if not ready_only:
                    rows.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": entry.spec.error})
                continue
            for v, state in sorted(entry.versions.items()):
                if ready_only and not state.ready:
                    continue
                rows.append({"name": name, "version": str(v), "state": state.state, "reason": state.reason})
        return rows

    # --- settling -----------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Anything for ``settle`` to do (checked on the router's hot path)."""
        return bool(self._waiters or self._answers or self.registry.staging or self.registry.retiring)

    def settle(self, running_instances: set[int]) -> Settled:
        """Swap staged entries that are ready, drop those that failed, answer the
        calls whose model settled (and those answered later), and pick retired instances
        that are idle. ``running_instances`` holds ``id()`` of instances with a batch in flight."""
        out = Settled(self._answers)
        self._answers = []
        registry = self.registry
        for name, entry in list(registry.staging.items()):
            if _loading(entry):
                continue
            del registry.staging[name]
            problem = _problem(entry)
            if problem:
                log.error("reloading model '%s' failed, the loaded one keeps serving: %s", name, problem)
                registry.retiring.append(entry)
                self._answer(out, name, _load_failed(name, problem))
                continue
            old = registry.models.get(name)
            registry.models[name] = entry
            registry.generation += 1
            if old is not None:
                registry.retiring.append(old)
            log.info("model '%s' reloaded: the new versions serve", name)
            self._answer(out, name, None)
        for waiter in list(self._waiters):
            if not self._answerable(waiter) or waiter.name in registry.staging:
                continue
            current = registry.models.get(waiter.name)
            if current is not None and _loading(current):
                continue
            self._waiters.remove(waiter)
            error: ConveyorError | None
            if current is None:  # what Triton answers for the same miss
                error = ConveyorError(Status.INTERNAL, f"failed to load '{name_of(waiter.name)}', "
                                                       "unexpected miss in global map")
            else:
                problem = _problem(current)
                error = _load_failed(waiter.name, problem) if problem else None
            out.answers.append(Answer(waiter.reply_to, error))
        keep: list[ModelEntry] = []
        for entry in registry.retiring:
            states = list(entry.versions.values())
            if any(len(s.batcher) for s in states) or any(
                id(i) in running_instances for s in states for i in s.instances
            ):
                keep.append(entry)
                continue
            out.unload += [i for s in states for i in s.instances if i.worker is not None]
        registry.retiring = keep
        return out

    # --- internals ------------------------------------------------------------------------

    def _answerable(self, waiter: LoadWaiter) -> bool:
        """Nothing its answer depends on is still being prepared."""
        return waiter.resolved and not any(key in self._preparing for key in waiter.keys)

    def _answer(self, out: Settled, name: str, error: ConveyorError | None) -> None:
        for waiter in [w for w in self._waiters if w.name == name and self._answerable(w)]:
            self._waiters.remove(waiter)
            out.answers.append(Answer(waiter.reply_to, error))

    def _fail(self, waiter: LoadWaiter, error: ConveyorError) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            self._answers.append(Answer(waiter.reply_to, error))

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
        self._prints[key] = done.print
        entry = registry.build(spec)
        registry.unloaded.pop(key, None)
        previous = registry.staging.pop(key, None)
        if previous is not None:
            registry.retiring.append(previous)  # a newer load supersedes a reload still loading
        if key in registry.models and not registry.models[key].spec.error and _serving(registry.models[key]):
            registry.staging[key] = entry
        else:
            old_entry = registry.models.get(key)
            if old_entry is not None:
                registry.retiring.append(old_entry)
            registry.models[key] = entry
            registry.generation += 1
        if spec.error:
            log.error("model '%s' is not available: %s", key, spec.error)
        else:
            if prep.why is Why.STARTUP:
                log.info("model '%s' versions %s", key, sorted(spec.versions))
            log_unused_fields(key, spec.config)
        if prep.waiter is not None and prep.waiter in self._waiters:
            self._load_composing(key, prep.waiter)

    def _unload(self, name: str) -> None:
        self._cancel(name)
        registry = self.registry
        override = self._overrides.pop(name, None)
        if override:
            self._remove(override)
        for source in (registry.staging, registry.models):
            entry = source.pop(name, None)
            if entry is not None:
                registry.retiring.append(entry)
        registry.unloaded[name] = "unloaded"
        self._prints.pop(name, None)
        registry.generation += 1

    def _cancel(self, key: str) -> None:
        """No load of ``key`` asked for so far will apply: what is being prepared is dropped
        when it comes, what waits behind it is dropped now, and their calls are answered."""
        self._epochs[key] = self._epochs.get(key, 0) + 1
        queued = self._preparing.get(key)
        if queued:
            self._startup_left -= sum(1 for p in queued if p.why is Why.STARTUP)
            queued.clear()
        for waiter in [w for w in self._waiters if w.name == key or key in w.keys]:
            self._fail(waiter, ConveyorError(
                Status.CANCELLED,
                f"failed to load '{name_of(waiter.name)}': '{name_of(key)}' was unloaded while it was loading"))

    def register(self, root: str, mapping: dict[str, str], reply_to: Any) -> None:
        """Serve the models under ``root`` too, directory ``d`` as model ``mapping[d]``
        (or as ``d``): Triton's repository registration, which SageMaker's load uses.
        Answered once the agent has looked at ``root``."""
        root = os.path.normpath(root)
        error = self._registration_problem(root, mapping)
        if error is not None:
            raise error
        repos = self._repos()

        def checked(outcome: tuple[bool, dict[str, str]] | Exception) -> None:
            error = self._registration_problem(root, mapping, outcome)
            if error is None:
                self._registered[root] = dict(mapping)
            self._answers.append(Answer(reply_to, error))

        self.agent.submit(Lane.SCAN, lambda: registration_check(root, repos), checked)

    def _registration_problem(self, root: str, mapping: dict[str, str],
                              looked: tuple[bool, dict[str, str]] | Exception | None = None) -> ConveyorError | None:
        """Why ``root`` cannot be registered: before looking at it, then with what the agent found."""
        if root in self._registered or root in (os.path.normpath(r) for r in self.repositories):
            return ConveyorError(Status.ALREADY_EXISTS, f"model repository '{root}' has already been registered")
        if looked is None:
            return None
        if isinstance(looked, Exception) or not looked[0]:
            return invalid_arg(f"failed to register '{root}', repository not found")
        taken = looked[1]
        for subdir, name in mapping.items():
            if name in taken and taken[name] != os.path.join(root, subdir):
                return ConveyorError(Status.ALREADY_EXISTS,
                                     f"failed to register '{root}', there is a conflicting mapping for '{name}'")
        return None

    def unregister(self, root: str) -> None:
        if self._registered.pop(os.path.normpath(root), None) is None:
            raise invalid_arg(f"failed to unregister '{root}', repository not found")

    def _keys(self, name: str, on_disk: dict[str, str]) -> list[str]:
        """The keys of the models named ``name`` on disk."""
        if name in on_disk:
            return [name]
        return [k for k in self.registry.namespaced.get(name, ()) if k in on_disk] or [
            k for k in on_disk if name_of(k) == name]


def _loading(entry: ModelEntry) -> bool:
    return not entry.spec.error and any(s.state == "LOADING" for s in entry.versions.values())


def _serving(entry: ModelEntry) -> bool:
    return any(s.ready for s in entry.versions.values())


def _problem(entry: ModelEntry) -> str:
    """Why a settled entry is not fully ready ('' if every version is)."""
    if entry.spec.error:
        return entry.spec.error
    if not entry.versions:
        return _NO_VERSION
    # Triton's load tracker: one "version N is at STATE state: reason;" per version that failed.
    return "".join(f"version {s.label} is at UNAVAILABLE state: {s.reason};"
                   for s in entry.versions.values() if not s.ready)


_NO_VERSION = "no version is available"


def _load_failed(name: str, problem: str) -> ConveyorError:
    if problem == _NO_VERSION:
        return ConveyorError(Status.INVALID_ARG, f"failed to load '{name}', {problem}")
    if problem.startswith("version "):
        return ConveyorError(Status.INVALID_ARG, f"load failed for model '{name}': {problem}\n")
    return ConveyorError(Status.INVALID_ARG, f"failed to load '{name}': {problem}")
