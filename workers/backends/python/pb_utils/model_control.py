"""``pb_utils.load_model``, ``unload_model`` and ``is_model_ready``: model
management from inside a model, through the worker's BLS link to the router
(the same operations as the repository extension's, so loading and unloading
need ``--model-control-mode explicit``, as in Triton)."""

from __future__ import annotations

from typing import Any

from conveyor.proto.errors import ConveyorError
from conveyor.workers.backends.python.pb_utils import bls
from conveyor.workers.backends.python.pb_utils.errors import TritonModelException

# A load answers once the model is ready.
LOAD_TIMEOUT_S = 600.0
CONTROL_TIMEOUT_S = 30.0


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name``; ``config`` (JSON) and ``files`` ("file:<version>/<name>"
    -> bytes) override the repository's, as the repository extension's load does."""
    args: dict[str, Any] = {"model": model_name}
    if config:
        args["config"] = config
    if files:
        args["files"] = {key.removeprefix("file:"): bytes(data) for key, data in files.items()}
    _call("repository_load", args, LOAD_TIMEOUT_S)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _call("repository_unload", {"model": model_name, "unload_dependents": unload_dependents}, CONTROL_TIMEOUT_S)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return bool(_call("model_ready", {"model": model_name, "version": model_version}, CONTROL_TIMEOUT_S))


def _call(op: str, args: dict[str, Any], timeout_s: float) -> Any:
    try:
        return bls.executor().control(op, args, timeout_s)
    except ConveyorError as exc:
        raise TritonModelException(exc.message) from None
