"""Importing a Triton ``model.py`` the way Triton's Python backend stub does.

Each instance imports the file under a module name of its own (instances of
one model, and versions of it, do not share module state), with the file's
directory on ``sys.path`` so the model's own helper modules import, and with
Conveyor's utilities importable as ``triton_python_backend_utils``.

As Triton's stub imports ``<version>.model``, the file is a module of a package:
the version directory, here under a package name of the instance's own (every
model's version directory is "1"), so ``from . import helper`` imports
``<version dir>/helper.py`` too.
"""

from __future__ import annotations

import contextvars
import importlib.machinery
import importlib.util
import itertools
import os
import re
import sys
import threading
import types
from typing import Any

from conveyor.proto.errors import unavailable
from conveyor.proto.repository_files import check_regular, read_bytes, unreadable
from conveyor.workers.backends.python import pb_utils

UTILS_MODULE = "triton_python_backend_utils"
MODEL_CLASS = "TritonPythonModel"

_lock = threading.Lock()  # instances load in their own threads; sys.path/sys.modules are shared
_serial = itertools.count()


def register_utils() -> None:
    """Make ``import triton_python_backend_utils`` find Conveyor's utilities, and give models
    the empty command line Triton's stub gives them: a model that runs ``unittest.main()``
    (Triton's QA models do) or argparse must not read the worker's own options."""
    sys.modules.setdefault(UTILS_MODULE, pb_utils)
    if len(sys.argv) > 1:
        sys.argv[:] = [""]


# The module of the model whose initialize/execute runs in this context (``running``).
_running: contextvars.ContextVar[types.ModuleType | None] = contextvars.ContextVar(
    "conveyor_running_model", default=None
)


class _RunningModel(types.ModuleType):
    """``sys.modules["model"]`` (the file's stem): the module of the model running in the
    caller's context. In Triton each model has a process of its own, where ``import model``
    (as ``unittest.main("model")`` does) finds that model's file; in a worker several models
    share ``sys.modules`` and ``sys.path``, so the name follows the model that asks."""

    def __getattr__(self, name: str) -> Any:
        module = _running.get()
        if module is None:
            raise AttributeError(f"no Python model runs here: module '{self.__name__}' has no attribute '{name}'")
        return getattr(module, name)

    def __dir__(self) -> list[str]:
        module = _running.get()
        return dir(module) if module is not None else []


class running:  # lower case: used as a function, ``with running(cls):``
    """``import <stem>`` in this context (and the tasks it starts) is ``model_class``'s module.
    A class rather than ``contextlib.contextmanager``: it runs around every ``execute``, and a
    generator-based manager costs several times as much."""

    __slots__ = ("_module", "_token")

    def __init__(self, model_class: type[Any]) -> None:
        self._module = sys.modules.get(model_class.__module__)

    def __enter__(self) -> None:
        self._token = _running.set(self._module)

    def __exit__(self, *exc: object) -> None:
        _running.reset(self._token)


class _ModelLoader(importlib.machinery.SourceFileLoader):
    """The model file's loader: it reads the file (and its cached bytecode) without blocking, so a
    name swapped for a FIFO after the check is refused rather than waited on (proto/repository_files.py)."""

    def get_data(self, path: str) -> bytes:
        return read_bytes(path, limit=None)


def import_model_class(path: str, label: str) -> type[Any]:
    """``TritonPythonModel`` from the file at ``path``; ``label`` names the module.

    Raises UNAVAILABLE with the reason (the exception the import raised) when the
    file cannot be imported or defines no such class.
    """
    try:
        check_regular(path)
    except FileNotFoundError:
        raise unavailable(f"Python model file not found in '{path}'") from None  # Triton's words
    except OSError as exc:  # a FIFO, a directory, a device: refused, never waited on
        raise unavailable(unreadable(path, exc)) from None
    package_name = "_conveyor_model_" + re.sub(r"\W", "_", label) + f"_{next(_serial)}"
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    module_name = f"{package_name}.{stem}"
    with _lock:
        register_utils()
        model_dir = os.path.dirname(os.path.abspath(path))
        if model_dir not in sys.path:
            sys.path.append(model_dir)
        spec = importlib.util.spec_from_file_location(module_name, path, loader=_ModelLoader(module_name, path))
        if spec is None or spec.loader is None:
            raise unavailable(f"cannot import python model file '{path}'")
        if stem not in sys.modules:  # never over a module of that name the process has already
            sys.modules[stem] = _RunningModel(stem)
        package = types.ModuleType(package_name)
        package.__path__ = [model_dir]  # relative imports find the model's sibling files
        package.__package__ = package_name
        module = importlib.util.module_from_spec(spec)
        # Registered before it runs: dataclasses, pickle and typing look their module up by name.
        sys.modules[package_name] = package
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            _forget_package(package_name)
            raise unavailable(f"failed to import '{path}': {type(exc).__name__}: {exc}") from None
    model_class = getattr(module, MODEL_CLASS, None)
    if not isinstance(model_class, type):
        raise unavailable(f"'{path}' does not define class {MODEL_CLASS}")
    return model_class


def forget_module(model_class: type[Any]) -> None:
    """Drop an unloaded instance's module, its package and what it imported relatively from ``sys.modules``."""
    with _lock:
        _forget_package(model_class.__module__.rpartition(".")[0] or model_class.__module__)


def _forget_package(package_name: str) -> None:
    """Under ``_lock``."""
    prefix = package_name + "."
    # A copy first, in one step: other threads import meanwhile (another instance's load), and iterating
    # sys.modules itself failed with "dictionary changed size during iteration".
    for name in [n for n in list(sys.modules) if n == package_name or n.startswith(prefix)]:
        sys.modules.pop(name, None)
