"""What the repository agent does for the lifecycle (``router/repository/agent.py``): plain
functions of the values handed over, which read and write the disk and touch none of the
router's state. The lifecycle (``router/lifecycle/``) asks for them and applies their
results on the loop."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import text_format

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import client_mistake
from conveyor.proto.model_config import parse_text
from conveyor.proto.repository_files import read_text
from conveyor.router.repository.backend_config import BackendConfig
from conveyor.router.repository.scan import config_file, load_spec, model_dirs
from conveyor.router.spec.model_spec import ModelSpec
from conveyor.router.spec.namespaces import assign_keys, name_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Repositories:
    """Where models are found: the roots (local paths; remote ones are mirrors), and the
    repositories registered at run time (root -> subdirectory -> model name), a snapshot."""

    roots: tuple[str, ...]
    registered: dict[str, dict[str, str]] = field(default_factory=dict)
    namespacing: bool = False
    sync: Callable[[], None] | None = None  # refresh the remote mirrors (None: every root is local)


@dataclass(frozen=True)
class SpecSettings:
    """How a config is read: the start-up flags, and the registered roots (their directories
    serve under mapped names)."""

    autocomplete: bool = True
    config_name: str = ""
    backend_config: BackendConfig = field(default_factory=BackendConfig)
    registered: frozenset[str] = frozenset()


@dataclass
class Listing:
    """The repositories as one look found them."""

    dirs: list[tuple[str, str]]  # (name, directory), repository by repository
    on_disk: dict[str, str]  # registry key -> model directory
    prints: dict[str, str] = field(default_factory=dict)  # key -> fingerprint (polls only)
    twice: frozenset[str] = frozenset()  # names more than one repository holds (Triton loads none of them)


@dataclass
class Prepared:
    """One model read and its config completed, ready for the loop to build its entry."""

    spec: ModelSpec
    print: str  # the directory's fingerprint when it was read
    written: str = ""  # the directory this load wrote its file overrides into ("" none)
    # ``fingerprints``' parts: its files but the configs, per version folder and "" for the shared ones ({}: unknown).
    content: dict[str, str] = field(default_factory=dict)


def listing(repos: Repositories, *, sync: bool = False, prints: bool = False, quiet: bool = True) -> Listing:
    """Mirror the remote roots first with ``sync``; fingerprint every model with ``prints``."""
    if sync and repos.sync is not None:
        repos.sync()
    dirs = all_model_dirs(repos, quiet=quiet)
    found = on_disk(repos, dirs)
    twice = frozenset() if repos.namespacing else duplicated_names(dirs)
    return Listing(dirs, found, {key: fingerprint(path) for key, path in found.items()} if prints else {}, twice)


def all_model_dirs(repos: Repositories, *, quiet: bool) -> list[tuple[str, str]]:
    """(name, directory) of every model the roots hold, and of those a registered repository holds in a
    directory its mapping does not name: as in Triton, a registered repository is a repository, its mapped
    directories renamed (SageMaker's ensemble archives: the ensemble mapped, its steps by their own names)."""
    dirs = model_dirs(list(repos.roots), quiet=quiet)
    for root, mapping in repos.registered.items():
        dirs += [(entry, path) for entry, path in model_dirs([root], quiet=True) if entry not in mapping]
    return dirs


def duplicated_names(dirs: list[tuple[str, str]]) -> frozenset[str]:
    """The model names that more than one repository holds (without --model-namespacing)."""
    seen: set[str] = set()
    twice: set[str] = set()
    for name, _ in dirs:
        (twice if name in seen else seen).add(name)
    return frozenset(twice)


def on_disk(repos: Repositories, dirs: list[tuple[str, str]] | None = None) -> dict[str, str]:
    """Registry key -> model directory (the key is the name, but see router/spec/namespaces.py)."""
    found: dict[str, str] = {}
    for root, mapping in repos.registered.items():
        for subdir, name in mapping.items():
            if os.path.isdir(os.path.join(root, subdir)):
                found.setdefault(name, os.path.join(root, subdir))
    if dirs is None:
        dirs = all_model_dirs(repos, quiet=True)
    if repos.namespacing:  # registered repositories keep Triton's global names
        for key, path in assign_keys(dirs).items():
            found.setdefault(key, path)
        return found
    for entry, path in dirs:
        found.setdefault(entry, path)
    return found


_PYCACHE = os.sep + "__pycache__" + os.sep  # in a relative path made to start with os.sep


def fingerprint(path: str) -> str:
    """Changes when any file under a model directory is added, removed or modified."""
    return fingerprints(path)[0]


def fingerprints(path: str) -> tuple[str, dict[str, str]]:
    """``fingerprint``, and the same of the files but the configs (``config.pbtxt``, ``configs/``) and the bytecode
    Python writes beside a model's modules (``__pycache__``), in parts: one per top-level folder whose name is a
    number (a version's files), and "" for the rest (what every version shares). Triton reloads a version whose
    own files changed, every version when a shared one did, and none for a config change of instance groups."""
    whole = hashlib.sha1()
    parts: dict[str, Any] = {}  # part -> its sha1
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for f in sorted(files):
            full = os.path.join(root, f)
            try:
                st = os.stat(full)
            except OSError:
                continue
            rel = os.path.relpath(full, path)
            line = f"{rel}\0{st.st_mtime_ns}\0{st.st_size}\n".encode()
            whole.update(line)
            if rel != "config.pbtxt" and not rel.startswith("configs" + os.sep) and _PYCACHE not in os.sep + rel:
                top = rel.split(os.sep, 1)[0] if os.sep in rel else ""
                part = top if top.isdigit() else ""
                if part not in parts:
                    parts[part] = hashlib.sha1()
                parts[part].update(line)
    return whole.hexdigest(), {part: h.hexdigest() for part, h in parts.items()}


def prepare(key: str, path: str, override: mc.ModelConfig | None, files: dict[str, bytes] | None,
            settings: SpecSettings, error: str = "") -> Prepared:
    """Read model ``key`` from ``path`` (or from ``files``, written into a directory of their
    own: ``ConveyorError`` when they cannot be) and complete its config. With ``error`` the
    model is known to be unavailable already: it is only fingerprinted (polls compare)."""
    written = ""
    if files:
        path = written = write_override(name_of(key), files)
    print_, content = fingerprints(path)
    if error:
        return Prepared(failed_spec(key, path, error, whole=True), print_)
    try:
        spec = model_spec(key, path, override, settings)
    except Exception as exc:  # a model file that breaks a reader: that model is unavailable, no other
        log.exception("reading model '%s' failed", key)
        spec = failed_spec(key, path, f"cannot be read: {exc}")
    return Prepared(spec, print_, written, content)


def failed_spec(key: str, path: str, error: str, whole: bool = False) -> ModelSpec:
    """An unavailable model's spec: ``error`` is the reason (``whole``), or what follows its name."""
    name = name_of(key)
    spec = ModelSpec(name=name, path=path, error=error if whole else f"model '{name}' {error}")
    spec.key = key if key != name else ""
    return spec


def model_spec(key: str, path: str, override: mc.ModelConfig | None, settings: SpecSettings) -> ModelSpec:
    name = name_of(key)
    if override is None and os.path.basename(path) != name and os.path.dirname(path) in settings.registered:
        override = renamed_config(name, path, settings.config_name)
    spec = load_spec(name, path, override=override, autocomplete=settings.autocomplete,
                     config_name=settings.config_name, backend_config=settings.backend_config)
    spec.key = key if key != name else ""
    return spec


def renamed_config(name: str, path: str, config_name: str) -> mc.ModelConfig | None:
    """A mapped directory serves under its mapped name: its config is read with that name."""
    try:
        config = parse_text(read_text(config_file(path, config_name)))
    except (OSError, text_format.ParseError, UnicodeDecodeError):
        return None  # load_spec reports the problem
    config.name = name
    return config


def write_override(name: str, files: dict[str, bytes]) -> str:
    """A model directory of its own for a load with file overrides (``<version>/<file>``
    keys), as Triton does: the repository's directory for the model is not used. Nothing is
    written outside it: a key that leaves it is refused, no file is opened through a link."""
    poll_failure = client_mistake(f"failed to load '{name}', failed to poll from model repository")
    try:
        root = tempfile.mkdtemp(prefix=f"{name}-", dir=override_root())
    except (OSError, ValueError) as exc:  # the overrides' folder is not ours (override_root), a NUL in the name
        log.error("failed to poll model '%s': no folder for its file overrides: %s", name, exc)
        raise poll_failure from None
    for key, data in files.items():
        rel = key.lstrip("/")  # "file:/1/model.py" is "file:1/model.py" to Triton too (model_control QA)
        path = os.path.normpath(os.path.join(root, rel))
        if not path.startswith(root + os.sep) or not rel.split("/", 1)[0].isdigit():
            shutil.rmtree(root, ignore_errors=True)
            log.error("failed to poll model '%s': file override 'file:%s' must be <version>/<file name>", name, rel)
            raise poll_failure
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except (OSError, ValueError) as exc:  # a name too long, a NUL: Triton's filesystem error, its poll failure
            shutil.rmtree(root, ignore_errors=True)
            log.error("failed to poll model '%s': file override 'file:%s': %s", name, rel, exc)
            raise poll_failure from None
    return root


# The folder of every load's file overrides, one per user: created private, and used only while it
# is a directory of this user's that no one else may write (else another local user could swap a
# load's folder for a link while its files are written).
OVERRIDES_FOLDER = "conveyor-load-overrides-{uid}"


def override_root() -> str:
    """The folder loads with file overrides write into (``$TMPDIR``); OSError when it is not private."""
    root = os.path.join(tempfile.gettempdir(), OVERRIDES_FOLDER.format(uid=os.geteuid()))
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OSError(f"'{root}' is not a directory of this user's that only it may write")
    return root


def remove_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def registration_check(root: str, repos: Repositories) -> tuple[bool, dict[str, str]]:
    """Whether ``root`` is a directory, and the models on disk it must not conflict with."""
    return os.path.isdir(root), on_disk(repos)
