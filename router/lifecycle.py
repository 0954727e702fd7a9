"""Model lifecycle: Triton's model control modes, load / unload / reload, and
repository polling.

Reload without loss: a model that is already serving is reloaded into
``registry.staging``; its old entry keeps serving until every new version is
READY, then the two swap and the old entry retires (it finishes its queued and
running requests, then its instances are unloaded). A reload that fails leaves
the old model serving, as Triton documents. A model that was not serving loads
in place. ``settle`` is called after every event that can change an instance's
state and returns what the router must do: answer waiting load calls, unload
instances.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format, text_format

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status, invalid_arg
from conveyor.proto.model_config import parse_text
from conveyor.router.models import Instance, ModelEntry, ModelRegistry
from conveyor.router.repository.backend_config import BackendConfig
from conveyor.router.repository.config_unused import log_unused_fields
from conveyor.router.repository.namespaces import assign_keys, duplicated, name_of, step_key
from conveyor.router.repository.scan import ModelSpec, config_file, load_spec, model_dirs, scan

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


@dataclass(slots=True)
class LoadWaiter:
    """A load call to answer once its model has settled (an opaque handle of the router's)."""

    name: str
    reply_to: Any


@dataclass
class Settled:
    answers: list[tuple[Any, ConveyorError | None]] = field(default_factory=list)
    unload: list[Instance] = field(default_factory=list)


def fingerprint(path: str) -> str:
    """Changes when any file under a model directory is added, removed or modified."""
    h = hashlib.sha1()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for f in sorted(files):
            full = os.path.join(root, f)
            try:
                st = os.stat(full)
            except OSError:
                continue
            h.update(f"{os.path.relpath(full, path)}\0{st.st_mtime_ns}\0{st.st_size}\n".encode())
    return h.hexdigest()


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
    ) -> None:
        self.registry = registry
        # --model-namespacing: models are keyed as router/repository/namespaces.py says.
        self.namespacing = registry.namespacing = namespacing
        self.repositories = repositories
        self.mode = mode
        self.load_at_start = load_at_start or []
        self.strict_config = strict_config
        self.config_name = config_name  # --model-config-name
        self.backend_config = backend_config or BackendConfig()
        self._waiters: list[LoadWaiter] = []
        self._overrides: dict[str, str] = {}  # model -> directory written for a load with file overrides
        self._prints: dict[str, str] = {}  # model -> fingerprint of what is loaded
        # Repositories registered at run time (SageMaker's multi-model load), each with
        # its subdirectory -> model name mapping, as Triton's RegisterModelRepository.
        self._registered: dict[str, dict[str, str]] = {}

    # --- start-up and polling ---------------------------------------------------------

    def startup(self) -> None:
        if self.namespacing:
            self.registry.namespaced = duplicated(self._on_disk())
        if self.mode is ControlMode.EXPLICIT and "*" not in self.load_at_start:
            names = self._on_disk()
            specs: dict[str, ModelSpec] = {}
            for name in self.load_at_start:
                keys = self._keys(name, names)
                if not keys:
                    log.error("--load-model %s: no such model in the repositories", name)
                for key in keys:
                    specs[key] = self._spec(key, names[key])
        else:
            specs = scan(self.repositories, autocomplete=not self.strict_config, config_name=self.config_name,
                         backend_config=self.backend_config, namespacing=self.namespacing)
        for name, spec in specs.items():
            self._prints[name] = fingerprint(spec.path)
        self.registry.replace(specs)
        for name, spec in specs.items():
            if spec.error:
                log.error("model '%s' is not available: %s", name, spec.error)
            else:
                log.info("model '%s' versions %s", name, sorted(spec.versions))
                log_unused_fields(name, spec.config)

    def startup_outcome(self) -> str | None:
        """After start-up: None while a model still loads, else why not every model is ready
        ('' when all are): what --exit-on-error decides on."""
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
        """POLL mode: load new and changed models, unload removed ones."""
        names = self._on_disk()
        if self.namespacing:
            namespaced = duplicated(names)
            if namespaced != self.registry.namespaced:
                # Keys changed: ensembles resolve their steps again (they do on being built).
                self.registry.namespaced = namespaced
                for key, entry in self.registry.models.items():
                    if entry.spec.backend == "ensemble":
                        self._prints.pop(key, None)
        for name, path in sorted(names.items()):
            if self._prints.get(name) != fingerprint(path) and name not in self.registry.staging:
                log.info("model '%s' changed on disk: reloading", name)
                self._load(name, path, None)
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
        """Start loading ``name``; its waiter is answered from ``settle``."""
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
                # Triton logs the parse error and answers its poll failure (500; a client's mistake: 400).
                log.error("failed to poll model '%s': the 'config' parameter: %s", name, exc)
                raise invalid_arg(f"failed to load '{name}', failed to poll from model repository") from None
        on_disk = self._on_disk()
        # With --model-namespacing a name several repositories hold loads from each (as Triton).
        keys = self._keys(name, on_disk) or [name]
        key = keys[0]
        if not files and key in self._overrides:
            shutil.rmtree(self._overrides.pop(key), ignore_errors=True)  # back to the repository's files
        path = self._write_override(key, files) if files else on_disk.get(key)
        if path is None:
            # Triton's INTERNAL (500) for a model its repository does not hold: a client's mistake, 400.
            raise invalid_arg(f"failed to load '{name}', failed to poll from model repository")
        self._load(key, path, override)
        for other in keys[1:]:
            self._load(other, on_disk[other], override)
        for k in keys:
            self._load_composing(k, {k})
        self._waiters.append(LoadWaiter(key, reply_to))

    def _load_composing(self, name: str, seen: set[str]) -> None:
        """An ensemble's composing models load with it (as in Triton), unless already loaded."""
        entry = self.registry.models.get(name) or self.registry.staging.get(name)
        if entry is None:
            return
        on_disk = self._on_disk()
        for step in entry.spec.config.ensemble_scheduling.step:
            model = step_key(entry.spec.path, step.model_name, self.registry.namespaced)
            if model in seen:
                continue
            seen.add(model)
            if model not in self.registry.models and model in on_disk:
                self._load(model, on_disk[model], None)
                self._load_composing(model, seen)

    def _write_override(self, name: str, files: dict[str, bytes]) -> str:
        """A model directory of its own for a load with file overrides (``<version>/<file>``
        keys), as Triton does: the repository's directory for the model is not used."""
        root = tempfile.mkdtemp(prefix=f"{name}-", dir=_override_root())
        for key, data in files.items():
            rel = key.lstrip("/")  # "file:/1/model.py" is "file:1/model.py" to Triton too (model_control QA)
            path = os.path.normpath(os.path.join(root, rel))
            if not path.startswith(root + os.sep) or not rel.split("/", 1)[0].isdigit():
                shutil.rmtree(root, ignore_errors=True)
                log.error("failed to poll model '%s': file override 'file:%s' must be <version>/<file name>",
                          name, rel)
                raise invalid_arg(f"failed to load '{name}', failed to poll from model repository")
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            except OSError as exc:  # a name too long, say: Triton's filesystem error, its poll failure
                shutil.rmtree(root, ignore_errors=True)
                log.error("failed to poll model '%s': file override 'file:%s': %s", name, rel, exc)
                raise invalid_arg(f"failed to load '{name}', failed to poll from model repository") from None
        old = self._overrides.pop(name, None)
        if old:
            shutil.rmtree(old, ignore_errors=True)  # loaded instances hold what they need
        self._overrides[name] = root
        return root

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        self.check_control_allowed()
        if unload_dependents:
            for dependent in self._ensembles_using(name):
                self._unload(dependent)
        for key in [name, *self.registry.namespaced.get(name, ())]:
            if key in self.registry.models or key in self.registry.staging:
                self._unload(key)
        # as Triton: unloading what is not loaded succeeds

    def _ensembles_using(self, name: str) -> list[str]:
        return [
            ensemble for ensemble, entry in self.registry.models.items()
            if any(step.model_name == name for step in entry.spec.config.ensemble_scheduling.step)
        ]

    def index(self, ready_only: bool) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        on_disk = self._on_disk()
        keys = set(on_disk) | set(self.registry.models) | set(self.registry.unloaded)

        def order(key: str) -> tuple[str, str]:
            """By name, as Triton; with --model-namespacing by repository, then name (Triton's
            (namespace, name) order), a name several repositories hold once for each."""
            if not self.namespacing:
                return "", key
            entry = self.registry.models.get(key)
            path = on_disk.get(key) or (entry.spec.path if entry is not None else key)
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
        return bool(self._waiters or self.registry.staging or self.registry.retiring)

    def settle(self, running_instances: set[int]) -> Settled:
        """Swap staged entries that are ready, drop those that failed, answer the
        load calls whose model settled, and pick retired instances that are idle.
        ``running_instances`` holds ``id()`` of instances with a batch in flight."""
        out = Settled()
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
            current = registry.models.get(waiter.name)
            if waiter.name in registry.staging or current is None or _loading(current):
                continue
            problem = _problem(current)
            self._answer(out, waiter.name, _load_failed(waiter.name, problem) if problem else None)
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

    def _answer(self, out: Settled, name: str, error: ConveyorError | None) -> None:
        for waiter in [w for w in self._waiters if w.name == name]:
            self._waiters.remove(waiter)
            out.answers.append((waiter.reply_to, error))

    def _load(self, name: str, path: str, override: mc.ModelConfig | None) -> None:
        registry = self.registry
        spec = self._spec(name, path, override)
        self._prints[name] = fingerprint(path)
        entry = registry.build(spec)
        registry.unloaded.pop(name, None)
        previous = registry.staging.pop(name, None)
        if previous is not None:
            registry.retiring.append(previous)  # a newer load supersedes a reload still loading
        if name in registry.models and not registry.models[name].spec.error and _serving(registry.models[name]):
            registry.staging[name] = entry
        else:
            old = registry.models.get(name)
            if old is not None:
                registry.retiring.append(old)
            registry.models[name] = entry
            registry.generation += 1
        if spec.error:
            log.error("model '%s' is not available: %s", name, spec.error)
        else:
            log_unused_fields(name, spec.config)

    def _unload(self, name: str) -> None:
        registry = self.registry
        override = self._overrides.pop(name, None)
        if override:
            shutil.rmtree(override, ignore_errors=True)
        for source in (registry.staging, registry.models):
            entry = source.pop(name, None)
            if entry is not None:
                registry.retiring.append(entry)
        registry.unloaded[name] = "unloaded"
        self._prints.pop(name, None)
        registry.generation += 1

    def register(self, root: str, mapping: dict[str, str]) -> None:
        """Serve the models under ``root`` too, directory ``d`` as model ``mapping[d]``
        (or as ``d``): Triton's repository registration, which SageMaker's load uses."""
        root = os.path.normpath(root)
        if root in self._registered or root in (os.path.normpath(r) for r in self.repositories):
            raise ConveyorError(Status.ALREADY_EXISTS, f"model repository '{root}' has already been registered")
        if not os.path.isdir(root):
            raise invalid_arg(f"failed to register '{root}', repository not found")
        taken = self._on_disk()
        for subdir, name in mapping.items():
            if name in taken and taken[name] != os.path.join(root, subdir):
                raise ConveyorError(Status.ALREADY_EXISTS,
                                    f"failed to register '{root}', there is a conflicting mapping for '{name}'")
        self._registered[root] = dict(mapping)

    def unregister(self, root: str) -> None:
        if self._registered.pop(os.path.normpath(root), None) is None:
            raise invalid_arg(f"failed to unregister '{root}', repository not found")

    def _spec(self, key: str, path: str, override: mc.ModelConfig | None = None) -> ModelSpec:
        name = name_of(key)
        if override is None and os.path.basename(path) != name and os.path.dirname(path) in self._registered:
            override = self._renamed_config(name, path)
        spec = load_spec(name, path, override=override, autocomplete=not self.strict_config,
                         config_name=self.config_name, backend_config=self.backend_config)
        spec.key = key if key != name else ""
        return spec

    def _renamed_config(self, name: str, path: str) -> mc.ModelConfig | None:
        """A mapped directory serves under its mapped name: its config is read with that name."""
        try:
            with open(config_file(path, self.config_name), encoding="utf-8") as f:
                config = parse_text(f.read())
        except (OSError, text_format.ParseError, UnicodeDecodeError):
            return None  # load_spec reports the problem
        config.name = name
        return config

    def _on_disk(self) -> dict[str, str]:
        """Registry key -> model directory (the key is the name, but see router/repository/namespaces.py)."""
        found: dict[str, str] = {}
        for root, mapping in self._registered.items():
            for subdir, name in mapping.items():
                if os.path.isdir(os.path.join(root, subdir)):
                    found.setdefault(name, os.path.join(root, subdir))
        dirs = model_dirs(self.repositories, quiet=True)
        if self.namespacing:  # registered repositories keep Triton's global names
            for key, path in assign_keys(dirs).items():
                found.setdefault(key, path)
            return found
        for entry, path in dirs:
            found.setdefault(entry, path)
        return found

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


def _override_root() -> str:
    root = os.path.join(tempfile.gettempdir(), "conveyor-load-overrides")
    os.makedirs(root, exist_ok=True)
    return root
