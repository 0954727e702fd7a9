"""``pb_utils.load_model``, ``unload_model`` and ``is_model_ready``: model
management from inside a model, through the worker's BLS link to the router
(the same operations as the repository extension's, so loading and unloading
need ``--model-control-mode explicit``, as in Triton)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from conveyor.proto.errors import ConveyorError
from conveyor.workers.backends.python.pb_utils import bls
from conveyor.workers.backends.python.pb_utils.errors import TritonModelException

T = TypeVar("T")


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name``; ``config`` (JSON) and ``files`` ("file:<version>/<name>"
    -> bytes) override the repository's, as the repository extension's load does. Answers once the
    model is ready (proto/control.py's LOAD_TIMEOUT_S)."""
    wire = {key.removeprefix("file:"): bytes(data) for key, data in files.items()} if files else None
    _call(lambda: bls.executor().repository_load(model_name, config, wire))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _call(lambda: bls.executor().repository_unload(model_name, unload_dependents))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return _call(lambda: bls.executor().model_ready(model_name, model_version))


def _call(call: Callable[[], T]) -> T:
    try:
        return call()
    except ConveyorError as exc:
        raise TritonModelException(exc.message) from None
