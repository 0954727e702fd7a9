"""Where ``InferenceRequest.exec()``/``async_exec()`` send their requests.

The worker registers its BLS client here at start (``set_executor``); the
client lives in ``workers/backends/python_bls.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from conveyor.workers.backends.python_utils.errors import TritonModelException

if TYPE_CHECKING:
    from conveyor.workers.backends.python_utils.inference import InferenceRequest, InferenceResponse


class BlsExecutor(Protocol):
    def infer(self, request: InferenceRequest) -> InferenceResponse: ...

    def stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]: ...

    async def infer_async(self, request: InferenceRequest) -> InferenceResponse: ...


_executor: BlsExecutor | None = None


def set_executor(executor: BlsExecutor | None) -> None:
    global _executor
    _executor = executor


def executor() -> BlsExecutor:
    if _executor is None:
        raise TritonModelException("Business Logic Scripting needs a Conveyor worker to send requests through")
    return _executor
