"""Triton Python models (``backend: "python"``, ``<version>/model.py``) run in
the worker process itself: the worker is Python already, so there is no stub
process and no extra copy of tensors; inputs are numpy views of shared memory.

``execute`` gets one ``InferenceRequest`` per client request (not
concatenated, each with its own batch dimension) and returns one
``InferenceResponse`` per request, in order; a decoupled model returns None and
answers through each request's response sender instead.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
from typing import Any

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, internal, unavailable
from conveyor.proto.model_config import to_json
from conveyor.workers.backends.base import RequestItem, RequestOutcome
from conveyor.workers.backends.python.model_import import forget_module, import_model_class
from conveyor.workers.backends.python.pb_utils import InferenceRequest, InferenceResponse, Tensor, bls
from conveyor.workers.backends.python.pb_utils.inference import response_outcome

log = logging.getLogger(__name__)


def initialize_args(path: str, config: mc.ModelConfig, device: str, instance_name: str) -> dict[str, str]:
    """The ``args`` Triton passes to ``initialize``: every value a string."""
    version_dir = os.path.dirname(os.path.abspath(path))
    gpu = device.startswith("cuda")
    return {
        "model_config": json.dumps(to_json(config)),
        "model_instance_kind": "GPU" if gpu else "CPU",
        "model_instance_name": instance_name,
        "model_instance_device_id": device.split(":", 1)[1] if gpu and ":" in device else "0",
        "model_repository": os.path.dirname(version_dir),
        "model_version": os.path.basename(version_dir),
        "model_name": config.name,
    }


class PythonBackend:
    """One instance of a ``TritonPythonModel``: ``initialize`` at load,
    ``execute`` per batch, ``finalize`` at unload."""

    def __init__(self, path: str, config: mc.ModelConfig, device: str, instance: int = 0) -> None:
        self.name = config.name
        self.decoupled = config.model_transaction_policy.decoupled
        self._loop: asyncio.AbstractEventLoop | None = None
        # Triton names instances <model>_<group>_<index>; Conveyor numbers them across groups.
        self.instance_name = f"{config.name}_0_{instance}"
        args = initialize_args(path, config, device, self.instance_name)
        self.version = int(args["model_version"]) if args["model_version"].isdigit() else -1
        self._class = import_model_class(path, f"{config.name}_{args['model_version']}_{instance}")
        try:
            self.model = self._class()
            if not callable(getattr(self.model, "execute", None)):
                raise unavailable(f"'{path}': TritonPythonModel does not define execute(requests)")
            initialize = getattr(self.model, "initialize", None)
            if callable(initialize):
                initialize(args)
        except ConveyorError:
            forget_module(self._class)
            raise
        except Exception as exc:
            forget_module(self._class)
            raise unavailable(
                f"failed to initialize python model '{self.name}': {type(exc).__name__}: {exc}"
            ) from None

    def execute_requests(self, items: list[RequestItem]) -> list[RequestOutcome]:
        requests = [
            InferenceRequest.received(
                self.name, self.version, [Tensor(name, array) for name, array in item.inputs.items()],
                item.outputs, item.request_id, item.parameters, item.channel, self.decoupled,
            )
            for item in items
        ]
        if self.decoupled:
            self._execute_decoupled(requests)
            return []
        try:
            returned = self._execute(requests)
        except Exception as exc:
            log.warning("python model '%s' raised in execute", self.name, exc_info=True)
            raise internal(self._failed(f"{type(exc).__name__}: {exc}")) from None
        return [response_outcome(r) for r in self._responses(requests, returned)]

    def _execute(self, requests: list[InferenceRequest]) -> Any:
        """``execute``, which may be ``async def`` (e.g. to ``await`` several
        ``async_exec`` BLS calls): then it runs on this instance's event loop.
        BLS calls made meanwhile from this thread are made for ``requests``."""
        bls.enter_execute(requests)
        try:
            returned = self.model.execute(requests)
            if inspect.iscoroutine(returned):
                if self._loop is None:
                    self._loop = asyncio.new_event_loop()
                returned = self._loop.run_until_complete(returned)
        finally:
            bls.enter_execute(None)
        return returned

    def _execute_decoupled(self, requests: list[InferenceRequest]) -> None:
        """Responses go out through the senders, during execute or after it; a
        failed execute ends every request it left open with the failure."""
        try:
            returned = self._execute(requests)
        except Exception as exc:
            log.warning("python model '%s' raised in execute", self.name, exc_info=True)
            problem: str | None = self._failed(f"{type(exc).__name__}: {exc}")
        else:
            problem = None if returned is None else (
                f"Python model '{self.instance_name}' is using the decoupled mode and the execute function "
                "must return None."
            )
        if problem is not None:
            for request in requests:
                request.get_response_sender().fail(problem)

    def _responses(self, requests: list[InferenceRequest], returned: Any) -> list[InferenceResponse | None]:
        """One response per request: the list ``execute`` returned, or (when it
        returned None) what each request's response sender was given."""
        if returned is None:
            return [r.get_response_sender().response for r in requests]
        if not isinstance(returned, list | tuple) or len(returned) != len(requests):
            count = len(returned) if isinstance(returned, list | tuple) else type(returned).__name__
            raise internal(self._failed(
                f"execute must return a list of InferenceResponse, one per request: "
                f"got {count} for {len(requests)} request(s)"
            ))
        for r in returned:
            if not isinstance(r, InferenceResponse):
                raise internal(self._failed(f"execute returned a {type(r).__name__}, not an InferenceResponse"))
        return list(returned)

    def _failed(self, message: str) -> str:
        return f"Failed to process the request(s) for model instance '{self.instance_name}', message: {message}"

    def close(self) -> None:
        finalize = getattr(self.model, "finalize", None)
        try:
            if callable(finalize):
                finalize()
        except Exception:
            log.exception("finalize of python model '%s' failed", self.name)
        finally:
            if self._loop is not None:
                self._loop.close()
            forget_module(self._class)
