"""Where ``InferenceRequest.exec()``/``async_exec()`` send their requests, and
which requests a BLS call is made for.

The worker registers its BLS client here at start (``set_executor``); the
client lives in ``workers/backends/python/bls.py``. While an instance runs
``execute`` it records the batch's requests (``enter_execute``) in a context
variable: a BLS call made from that thread, or from the coroutine of an ``async
def execute`` and the tasks it creates (asyncio copies the context into them),
is made for them, and is cancelled when they all are.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from conveyor.workers.backends.python.pb_utils.errors import TritonModelException

if TYPE_CHECKING:
    from conveyor.workers.backends.python.pb_utils.inference import InferenceRequest, InferenceResponse


class BlsExecutor(Protocol):
    def infer(self, request: InferenceRequest) -> InferenceResponse: ...

    def stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]: ...

    async def infer_async(self, request: InferenceRequest) -> InferenceResponse: ...

    async def stream_async(self, request: InferenceRequest) -> Iterator[InferenceResponse]: ...

    # Control calls to the router on the model's behalf (proto/control.py's ops of those names).
    def model_ready(self, model: str, version: str) -> bool: ...

    def repository_load(self, model: str, config: str, files: dict[str, bytes] | None) -> None: ...

    def repository_unload(self, model: str, unload_dependents: bool) -> None: ...


_executor: BlsExecutor | None = None
# A context variable rather than a thread-local: an ``async def execute`` runs on the
# instance's event-loop thread, and its coroutine gets the context of the thread that
# scheduled it.
_scope: contextvars.ContextVar[Sequence[InferenceRequest] | None] = contextvars.ContextVar(
    "conveyor_bls_requests", default=None
)


def set_executor(executor: BlsExecutor | None) -> None:
    global _executor
    _executor = executor


def executor() -> BlsExecutor:
    if _executor is None:
        raise TritonModelException("Business Logic Scripting needs a Conveyor worker to send requests through")
    return _executor


# ``enter_execute(requests)``: the calling thread runs ``execute`` for ``requests`` (None: it is done). The
# context variable's own ``set``, not a function around it: it is called twice per batch.
enter_execute: Callable[[Sequence[InferenceRequest] | None], object] = _scope.set


def current_requests() -> Sequence[InferenceRequest] | None:
    """The requests the calling thread's ``execute`` serves (None outside ``execute``)."""
    return _scope.get()


# Set while the instance's thread runs ``initialize`` or ``finalize``, where Triton refuses BLS.
_refused: contextvars.ContextVar[bool] = contextvars.ContextVar("conveyor_bls_refused", default=False)


@contextlib.contextmanager
def refused() -> Iterator[None]:
    """BLS calls made from this context (not from threads it starts) raise, as in Triton."""
    token = _refused.set(True)
    try:
        yield
    finally:
        _refused.reset(token)


def check_allowed() -> None:
    if _refused.get():
        raise TritonModelException("BLS is only supported during the 'execute' function.")
