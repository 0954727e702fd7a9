"""The model repository extension's calls: load (with a config or file overrides),
unload, the index, and repository registration (SageMaker's multi-model load). Only
EXPLICIT mode allows loads and unloads. A call that is wrong is refused at once; the
others are answered later, from ``settle``."""

from __future__ import annotations

import logging
import os
from typing import Any

from google.protobuf import json_format

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status, client_mistake, invalid_arg
from conveyor.proto.model_config import parse_json_config
from conveyor.router.lifecycle.entry_state import loading, serving
from conveyor.router.lifecycle.loads import ModelLoads
from conveyor.router.lifecycle.records import Answer, ControlMode, DeferredUnload, LoadWaiter, Prep, Why
from conveyor.router.repository.agent import Lane
from conveyor.router.repository.prepare import Listing, listing, registration_check
from conveyor.router.spec.namespaces import name_of

log = logging.getLogger("conveyor.router.lifecycle")  # one name for all the lifecycle's log lines, as before


def check_model_name(name: str) -> None:
    """Triton's ValidateModelName, checked on load only (an unload of such a name finds nothing)."""
    trimmed = name.strip(" \t\n\r\f\v")
    if not trimmed:
        raise invalid_arg("Model name cannot be empty. Please enter a valid name to deploy.")
    if trimmed == ".." or "/" in trimmed:
        raise invalid_arg(f"invalid model name '{name}', model name must not contain path traversal characters")


def _relative_files(config: mc.ModelConfig) -> list[tuple[str, str]]:
    """The config's fields that name a file in the model's directory: (what it is, the name)."""
    named = [("default_model_filename", config.default_model_filename)]
    named += [(f"cc_model_filenames['{cc}']", f) for cc, f in config.cc_model_filenames.items()]
    named += [(f"label_filename of output '{o.name}'", o.label_filename) for o in config.output]
    named += [(f"input_data_file of warmup '{w.name}' input '{n}'", i.input_data_file)
              for w in config.model_warmup for n, i in w.inputs.items()]
    if config.HasField("sequence_batching"):
        named += [(f"data_file of state '{st.input_name}'", init.data_file)
                  for st in config.sequence_batching.state for init in st.initial_state]
    return [(what, name) for what, name in named if name]


def check_override_files(name: str, config: mc.ModelConfig) -> None:
    """A client's config names files inside the model's directory only: none absolute, none above it.
    Those files' contents reach the client (labels in classification answers), are run (a model file)
    or read whole (warmup and state data: ``/dev/zero`` would never end)."""
    for what, file in _relative_files(config):
        normal = os.path.normpath(file)
        if "\0" in file or os.path.isabs(file) or normal == ".." or normal.startswith("../"):
            raise invalid_arg(f"failed to load '{name}': the 'config' parameter's {what} '{file}' must name a "
                              "file inside the model's directory")


# Triton's OpenAI frontend (POST /v1/models/{name}/load|unload) keeps its own list of the models it
# serves: it loads only a model not on it and unloads only one that is, refusing in its own words (its
# ClientError: the OpenAI ingress answers 400). Checked here, where the calls are ordered, so that of
# concurrent calls on any ingress process one is done and the others refused, as its lock makes them.
FRONTEND_MODE = "Model load/unload requires --model-control-mode=explicit"


class RepositoryCalls(ModelLoads):
    def check_frontend_call(self, name: str, load: bool) -> None:
        """A call of Triton's OpenAI frontend: its mode (UNSUPPORTED), a load of a model loaded or loading
        (ALREADY_EXISTS), an unload of one that is neither (NOT_FOUND)."""
        if self.mode is not ControlMode.EXPLICIT:
            raise ConveyorError(Status.UNSUPPORTED, FRONTEND_MODE)
        held = self._frontend_holds(name)
        if load and held:
            raise ConveyorError(Status.ALREADY_EXISTS, f"Model '{name}' is already loaded")
        if not load and not held:
            raise ConveyorError(Status.NOT_FOUND, f"Unknown model: {name}")

    def _frontend_holds(self, name: str) -> bool:
        """On the frontend's list: serving, or on its way (a load call not answered yet, or being prepared)."""
        if any(name_of(w.name) == name for w in self._waiters):
            return True
        for key in [name, *self.registry.namespaced.get(name, ())]:
            entry = self.registry.models.get(key)
            if key in self._preparing or (entry is not None and (serving(entry) or loading(entry))):
                return True
        return False

    def check_control_allowed(self) -> None:
        if self.mode is not ControlMode.EXPLICIT:
            # Triton's words, whatever the mode (NONE too); --model-control-mode=explicit allows it.
            raise ConveyorError(Status.UNAVAILABLE, "explicit model load / unload is not allowed if polling is enabled")

    def load(self, name: str, reply_to: Any, config_json: str = "", files: dict[str, bytes] | None = None,
             frontend: bool = False) -> None:
        """Start loading ``name``; ``reply_to`` is answered from ``settle`` once it settled. What is
        wrong with the call itself is raised at once."""
        if frontend:
            self.check_frontend_call(name, load=True)
        self.check_control_allowed()
        check_model_name(name)
        if files and not config_json:
            # Triton reads the overrides' folder for a config.pbtxt, finds none: its poll failure.
            log.error("Poll failed for model directory '%s': file overrides ('file:' parameters) need a 'config' "
                      "too", name)
            raise client_mistake(f"failed to load '{name}', failed to poll from model repository")
        override = None
        if config_json:
            try:
                override = parse_json_config(config_json)
            except json_format.ParseError as exc:
                # Triton logs the parse error and answers its poll failure (500 / INTERNAL, its status by default).
                log.error("failed to poll model '%s': the 'config' parameter: %s", name, exc)
                raise client_mistake(f"failed to load '{name}', failed to poll from model repository") from None
            check_override_files(name, override)
        waiter = LoadWaiter(name, reply_to)
        self._waiters.append(waiter)
        repos = self._repos()
        # As Triton, a load looks at the repository afresh: remote ones are mirrored again first.
        self.agent.submit(self._listing_lane(), lambda: listing(repos, sync=True),
                          lambda outcome: self._resolved(waiter, override, files, outcome))

    def _resolved(self, waiter: LoadWaiter, override: mc.ModelConfig | None, files: dict[str, bytes] | None,
                  looked: Listing | Exception) -> None:
        if waiter not in self._waiters:
            return  # answered meanwhile: an unload of that name
        name = waiter.name
        if isinstance(looked, Exception):
            log.error("failed to poll model '%s': %s", name, looked)
            self._fail(waiter, client_mistake(f"failed to load '{name}', failed to poll from model repository"))
            return
        outcome, self.twice = looked.on_disk, looked.twice
        if name in looked.twice and not files:  # Triton's poll of a name two repositories hold
            log.error("failed to poll model '%s': not unique across all model repositories", name)
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

    def unload(self, name: str, unload_dependents: bool = False, frontend: bool = False) -> None:
        if frontend:
            self.check_frontend_call(name, load=False)
        self.check_control_allowed()
        if self.unload_waits:
            waiting = [w for w in self._waiters if w.name == name or name in w.keys]
            if waiting or self._load_in_flight(name):
                log.info("model '%s' is unloaded once the load in progress settles", name)
                self._deferred.append(DeferredUnload(name, unload_dependents, waiting))
                return
        self._unload_call(name, unload_dependents)

    def _apply_deferred(self) -> None:
        """Unloads that waited for their model's loads in progress: applied once those settled (their calls
        answered), as Triton's; a load asked after the unload is cancelled by it."""
        for deferred in list(self._deferred):
            if any(w in self._waiters for w in deferred.waiters) or (
                    not deferred.waiters and self._load_in_flight(deferred.name)):
                continue
            self._deferred.remove(deferred)
            self._unload_call(deferred.name, deferred.dependents)

    def _unload_call(self, name: str, unload_dependents: bool) -> None:
        # An ensemble that uses the model can no longer run: unloaded, with Triton's error line (its dependency
        # graph finds it invalid and unloads it, unload_dependents or not).
        for dependent in self._ensembles_using(name):
            log.error("ensemble %s contains models that are not available or ambiguous: %s", dependent, name)
            self._unload(dependent)
        upstream = self._composing_models(name) if unload_dependents else []
        for key in [name, *self.registry.namespaced.get(name, ())]:
            if key in self.registry.models or key in self.registry.staging or key in self._preparing:
                self._unload(key)  # listed as unloaded, as after Triton's load then unload
            else:
                self._cancel(key)  # a load whose look at the repository has not come back
        self._unload_unused(upstream)
        # as Triton: unloading what is not loaded succeeds

    def _composing_models(self, name: str) -> list[str]:
        entry = self.registry.models.get(name)
        return [] if entry is None else [step.model_name for step in entry.spec.config.ensemble_scheduling.step]

    def _unload_unused(self, models: list[str]) -> None:
        """Triton's cascading removal (unload_dependents): the models an unloaded ensemble was made of go too,
        unless loaded by their own name or still used by another loaded ensemble; so do theirs."""
        while models:
            model = models.pop()
            if (model not in self.registry.models or model in self._explicit
                    or self._ensembles_using(model)):
                continue
            models += self._composing_models(model)
            self._unload(model)

    def _ensembles_using(self, name: str) -> list[str]:
        return [
            ensemble for ensemble, entry in self.registry.models.items()
            if any(step.model_name == name for step in entry.spec.config.ensemble_scheduling.step)
        ]

    # --- the index ----------------------------------------------------------------------------

    def request_index(self, ready_only: bool, reply_to: Any) -> None:
        """The repository index, answered once the agent has looked at the repositories."""
        repos = self._repos()

        def indexed(outcome: Listing | Exception) -> None:
            if isinstance(outcome, Exception):
                error = ConveyorError(Status.INTERNAL, f"failed to read the model repositories: {outcome}")
                self._answers.append(Answer(reply_to, error))
            else:
                self.twice = outcome.twice
                self._answers.append(Answer(reply_to, result=self.index_rows(ready_only, outcome.on_disk)))

        self.agent.submit(Lane.SCAN, lambda: listing(repos), indexed)

    def index(self, ready_only: bool) -> list[dict[str, Any]]:
        """The index, reading the repositories in the caller's thread (tests and tools)."""
        looked = listing(self._repos())
        self.twice = looked.twice
        return self.index_rows(ready_only, looked.on_disk)

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
            if key in self.twice and key in found:  # Triton's index: a name two repositories hold (ready or not)
                rows.append({"name": name, "version": "", "state": "UNAVAILABLE",
                             "reason": "model appears in two or more repositories"})
                continue
            entry = self.registry.models.get(key)
            if entry is None:
                if not ready_only:
                    reason = self.poll_failures.get(key) or self.registry.unloaded.get(key, "")
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

    # --- repositories registered at run time ------------------------------------------------

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
