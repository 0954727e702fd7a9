"""Triton's model namespacing (``--model-namespacing=true``): every model repository is a
namespace, so several repositories may hold a model of the same name.

Registry keys: a model whose name is found in one repository only keeps its name as its
key, so nothing changes for it (nor for any deployment without duplicate names). A name
found in several repositories is keyed by its model directory (``<repository>/<name>``):
a path, which no model directory name can collide with since names hold no ``/``.
Ensemble steps are resolved to a key once, when the ensemble's entry is built (Triton:
the composing model in the ensemble's own repository first, else the only one of that
name), so a step's request is the same single dict lookup as any other. A request that
names a duplicated model misses the registry and is refused on that miss path with
Triton's ambiguity error (``ModelRegistry.entry``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from conveyor.proto.errors import ConveyorError, invalid_arg


def name_of(key: str) -> str:
    """The model name a registry key stands for."""
    return os.path.basename(key) if os.sep in key else key


def assign_keys(found: Iterable[tuple[str, str]]) -> dict[str, str]:
    """key -> model directory, from (name, directory) pairs in repository order: the name
    itself when it is found once, the directory when it is found more than once."""
    pairs = list(found)
    count: dict[str, int] = {}
    for name, _ in pairs:
        count[name] = count.get(name, 0) + 1
    return {(path if count[name] > 1 else name): path for name, path in pairs}


def duplicated(keys: Iterable[str]) -> dict[str, list[str]]:
    """name -> its keys, for the names that are held by more than one repository."""
    out: dict[str, list[str]] = {}
    for key in keys:
        if os.sep in key:
            out.setdefault(name_of(key), []).append(key)
    return out


def step_key(ensemble_dir: str, model: str, namespaced: dict[str, list[str]]) -> str:
    """The registry key an ensemble step naming ``model`` runs: the model of that name in
    the ensemble's own repository, else the only one of that name (Triton's rule)."""
    keys = namespaced.get(model)
    if not keys:
        return model
    own = os.path.join(os.path.dirname(ensemble_dir), model)
    if own in keys:
        return own
    return keys[0] if len(keys) == 1 else model


def ambiguous(model: str, count: int) -> ConveyorError:
    """Triton's refusal of a request naming a model that several repositories hold
    (ModelRepositoryManager::FindModelIdentifier, INVALID_ARG)."""
    return invalid_arg(
        f"There are {count} identifiers of model '{model}' in global map, "
        "model namespace must be provided to resolve ambiguity."
    )
