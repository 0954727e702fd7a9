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
import concurrent.futures
import inspect
import json
import logging
import os
import threading
import traceback
from typing import Any

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, internal, unavailable
from conveyor.proto.model_config import to_json
from conveyor.workers.backends.base import AnsweredLater, RequestItem, RequestOutcome
from conveyor.workers.backends.python.model_import import forget_module, import_model_class, running
from conveyor.workers.backends.python.pb_utils import (
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    InferenceRequest,
    InferenceResponse,
    Tensor,
    TritonModelException,
    bls,
)
from conveyor.workers.backends.python.pb_utils.inference import response_outcome

log = logging.getLogger(__name__)

_INVALID_NAME_CHARS = frozenset(";|&$`<>()[]{}\\\"'*?~#!")  # python_backend's INVALID_CHARS


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


# One lock per model name: its instances' ``initialize`` and ``finalize`` in this worker run one at a time.
# Triton runs each instance in a stub process of its own; here they are threads of one process, where a
# model's own cross-process exclusion (POSIX record locks, ``fcntl.lockf``, as Triton's QA models count their
# instances with) does not hold between them. ``execute`` is not serialized.
_LIFECYCLE_LOCKS: dict[str, threading.Lock] = {}
_LIFECYCLE_LOCKS_GUARD = threading.Lock()


def lifecycle_lock(model: str) -> threading.Lock:
    with _LIFECYCLE_LOCKS_GUARD:
        return _LIFECYCLE_LOCKS.setdefault(model, threading.Lock())


class PythonBackend:
    """One instance of a ``TritonPythonModel``: ``initialize`` at load,
    ``execute`` per batch, ``finalize`` at unload."""

    def __init__(
        self, path: str, config: mc.ModelConfig, device: str, instance: int = 0, instance_name: str = ""
    ) -> None:
        """``instance``: the router's number of the instance (it keeps module names apart);
        ``instance_name``: Triton's name of it (``<group>_<index>``, from the router)."""
        self.name = config.name
        self.decoupled = config.model_transaction_policy.decoupled
        self._loop: asyncio.AbstractEventLoop | None = None
        # BF16 inputs arrive as raw 16-bit words; their Tensors say so (as_numpy raises, as in Triton).
        self._bf16_inputs = frozenset(i.name for i in config.input if i.data_type == mc.TYPE_BF16)
        self._ready_lock = threading.Lock()
        self._ready_check: concurrent.futures.Future[bool] | None = None
        self.instance_name = instance_name or f"{config.name}_0_{instance}"
        if not self.instance_name or any(c in _INVALID_NAME_CHARS for c in self.instance_name):
            # Triton's check and words (it names the stub process after the instance): a name with
            # shell characters is refused, so Conveyor refuses the same models.
            raise unavailable("Invalid stub name: contains invalid characters")
        args = initialize_args(path, config, device, self.instance_name)
        self.version = int(args["model_version"]) if args["model_version"].isdigit() else -1
        self._class = import_model_class(path, f"{config.name}_{args['model_version']}_{instance}")
        try:
            self.model = self._class()
            if not callable(getattr(self.model, "execute", None)):
                raise unavailable(f"'{path}': TritonPythonModel does not define execute(requests)")
            initialize = getattr(self.model, "initialize", None)
            if callable(initialize):
                with lifecycle_lock(self.name), bls.refused(), running(self._class):
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
                self.name, self.version, self._tensors(item.inputs),
                item.outputs, item.request_id, item.parameters, item.channel, self.decoupled,
            )
            for item in items
        ]
        if self.decoupled:
            self._execute_decoupled(requests)
            return []
        try:
            responses = self._run(requests)
        except Exception as exc:
            log.warning("python model '%s' raised in execute", self.name, exc_info=True)
            error = internal(self._failed(f"{type(exc).__name__}: {exc}"))
            # As in Triton, a request whose response sender already sent its response keeps it:
            # the error reaches only the requests still unanswered.
            sent = [s.take_sent() if (s := r.sender_if_any()) is not None else None for r in requests]
            if all(r is None for r in sent):
                raise error from None
            return [error if r is None else response_outcome(r) for r in sent]
        return [
            response_outcome(r) if r is not None
            else AnsweredLater() if q.get_response_sender().answers_later else response_outcome(r)
            for q, r in zip(requests, responses, strict=True)
        ]

    def _tensors(self, inputs: dict[str, Any]) -> list[Tensor]:
        wrap = Tensor._of_input
        if not self._bf16_inputs:
            return [wrap(name, array) for name, array in inputs.items()]
        return [
            Tensor._of_bf16(name, array) if name in self._bf16_inputs else wrap(name, array)
            for name, array in inputs.items()
        ]

    def _run(self, requests: list[InferenceRequest]) -> list[InferenceResponse | None]:
        """``execute``, then again for the requests it rescheduled (``set_release_flags(
        TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)``), each time in an ``execute`` of their own on
        this instance, until none is: Triton puts them back in the model's queue instead."""
        responses = self._responses(requests, self._execute(requests))
        # (The flag read first: ``rescheduled()`` is only worth its call for a request that has it.)
        rescheduled = [i for i, request in enumerate(requests)
                       if request._release_flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE and request.rescheduled()]
        if not rescheduled:  # the common case: one execute
            return responses
        for i in rescheduled:
            responses[i] = None
        batch = rescheduled
        while batch:
            run = [requests[i] for i in batch]
            got = self._responses(run, self._execute(run))
            again = []
            for i, request, response in zip(batch, run, got, strict=True):
                if request.rescheduled():
                    again.append(i)
                else:
                    responses[i] = response
            batch = again
        return responses

    def _execute(self, requests: list[InferenceRequest]) -> Any:
        """``execute``; an ``async def execute`` runs on this instance's event loop, a thread
        of its own that keeps running between calls (as Triton's stub runs it), so tasks the
        coroutine starts go on after it returned. A decoupled model's coroutine runs in the
        background: the instance takes its next batch at once (None is returned). BLS calls
        made meanwhile from this thread, the coroutine or its tasks are made for ``requests``."""
        bls.enter_execute(requests)
        try:
            with running(self._class):
                returned = self.model.execute(requests)
            if type(returned) is not list and inspect.iscoroutine(returned):
                with running(self._class):  # the coroutine's context is a copy of this one
                    future = asyncio.run_coroutine_threadsafe(returned, self._event_loop())
                if self.decoupled:
                    future.add_done_callback(lambda f: self._background_done(f, requests))
                    return None
                returned = future.result()
        finally:
            bls.enter_execute(None)
        return returned

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name=f"{self.instance_name}-asyncio", daemon=True).start()
            self._loop = loop
        return self._loop

    def _background_done(self, future: concurrent.futures.Future[Any], requests: list[InferenceRequest]) -> None:
        """A decoupled ``async def execute`` ended: its failure is logged with the traceback (as
        Triton logs it) and ends the requests it left open."""
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            log.error("python model '%s': execute raised in the background:\n%s", self.instance_name, trace)
            problem = self._failed(f"{type(exc).__name__}: {exc}")
        elif future.result() is not None:
            problem = self._must_return_none()
        else:
            return
        for request in requests:
            request.get_response_sender().fail(problem)

    def _execute_decoupled(self, requests: list[InferenceRequest]) -> None:
        """Responses go out through the senders, during execute or after it; a
        failed execute ends every request it left open with the failure. Rescheduled
        requests are executed again, as in ``_run``."""
        while requests:
            try:
                returned = self._execute(requests)
            except Exception as exc:
                log.warning("python model '%s' raised in execute", self.name, exc_info=True)
                problem: str | None = self._failed(f"{type(exc).__name__}: {exc}")
            else:
                problem = None if returned is None else self._must_return_none()
            if problem is not None:
                for request in requests:
                    request.get_response_sender().fail(problem)
                return
            requests = [r for r in requests if r.rescheduled()]

    def _must_return_none(self) -> str:
        return (
            f"Python model '{self.instance_name}' is using the decoupled mode and the execute function "
            "must return None."
        )

    def _responses(self, requests: list[InferenceRequest], returned: Any) -> list[InferenceResponse | None]:
        """One response per request, in Triton's terms: the list ``execute`` returned, where a
        None (or a None list) leaves the request to its response sender: what it sent during
        execute, or, when it sent nothing yet, what it sends later (None here); a rescheduled
        request's is None, and must be.

        Raises ``TritonModelException`` as Triton's stub does: a returned value that is not a
        list of one response (or None) per request, or a response returned for a request whose
        sender already sent one."""
        if returned is None:
            returned = [None] * len(requests)
        if not isinstance(returned, list):
            raise TritonModelException(f"Expected a list in the execute return, found type '{type(returned)}'.")
        if len(returned) != len(requests):
            raise TritonModelException(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(returned)}\n"
            )
        responses: list[InferenceResponse | None] = []
        for request, response in zip(requests, returned, strict=True):
            rescheduled = bool(request._release_flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            if response is None:
                responses.append(None if rescheduled else request.get_response_sender().settle())
                continue
            if rescheduled:
                raise TritonModelException(
                    "Expected a None object in the execute function return list for reschduled request, "
                    f"found type '{type(response)}'."
                )
            if not isinstance(response, InferenceResponse):
                raise TritonModelException(
                    "Expected an 'InferenceResponse' object in the execute function return list, "
                    f"found type '{type(response)}'."
                )
            sender = request._sender
            if sender is not None:  # the model used it: a returned response counts as its one response
                sender.returned(response)
            responses.append(response)
        return responses

    @property
    def has_readiness(self) -> bool:
        """The model defines ``is_ready()``: the router asks it (router/user_readiness.py)."""
        return callable(getattr(self.model, "is_ready", None))

    def readiness(self) -> concurrent.futures.Future[bool]:
        """The model's ``is_ready()`` (Triton 2.6x), on a thread of its own beside the batches; a
        coroutine runs on the instance's event loop. A check still running is joined rather than
        started again, as Triton's stub does. Anything but ``True`` (False, another value, an
        exception) is not ready."""
        with self._ready_lock:
            if self._ready_check is None or self._ready_check.done():
                self._ready_check = concurrent.futures.Future()
                threading.Thread(target=self._run_is_ready, args=(self._ready_check,),
                                 name=f"{self.instance_name}-is_ready", daemon=True).start()
            return self._ready_check

    def _run_is_ready(self, done: concurrent.futures.Future[bool]) -> None:
        try:
            with running(self._class):
                result = self.model.is_ready()
                if inspect.iscoroutine(result):
                    result = asyncio.run_coroutine_threadsafe(result, self._event_loop()).result()
            if not isinstance(result, bool):
                log.error("python model instance '%s': is_ready() returned a %s, not a bool: not ready",
                          self.instance_name, type(result).__name__)
            done.set_result(result is True)
        except Exception:
            log.exception("python model instance '%s': is_ready() raised: not ready", self.instance_name)
            done.set_result(False)

    def _failed(self, message: str) -> str:
        return f"Failed to process the request(s) for model instance '{self.instance_name}', message: {message}"

    def close(self) -> None:
        finalize = getattr(self.model, "finalize", None)
        try:
            if callable(finalize):
                with lifecycle_lock(self.name), bls.refused():
                    finalize()
        except Exception:
            log.exception("finalize of python model '%s' failed", self.name)
        finally:
            if self._loop is not None:
                loop, self._loop = self._loop, None
                loop.call_soon_threadsafe(loop.stop)
            forget_module(self._class)
