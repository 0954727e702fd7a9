"""What a backend is: something that loads one model instance and runs batches.

Two kinds:

* ``Backend`` (onnxruntime): one call per batch on the requests' inputs
  concatenated along the batch dimension; outputs are split back by rows.
* ``RequestBackend`` (python): one call per batch on the list of requests, each
  with its own inputs (views of shared memory, not concatenated) and its own
  outcome, so one request can fail while the others succeed. Triton's Python
  backend works this way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from conveyor.proto.datatypes import deserialize_bytes, element_count, numpy_dtype
from conveyor.proto.errors import ConveyorError, Status

if TYPE_CHECKING:
    from conveyor.proto.messages import SequenceStep
    from conveyor.workers.loop_replies import LoopReplies


class Backend(Protocol):
    """One loaded model instance. ``execute`` may be called from a worker thread,
    one call at a time per instance. A backend whose instance is not tied to the thread
    that loaded it may say so with a true ``runs_on_any_thread`` attribute: its short
    batches may then run on the worker's main thread (``workers/inline.py``, which allows
    these backends longer batches there than Python models)."""

    def execute(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """Run one (possibly batched) call; BYTES tensors are object arrays of bytes."""
        ...

    def close(self) -> None: ...


class ParameterizedOutputs(dict[str, "np.ndarray | WireTensor"]):
    """A request's outputs plus the response parameters the model set for it; only
    built for a response that has parameters, so the others cost nothing."""

    __slots__ = ("parameters",)

    def __init__(self, parameters: dict[str, Any]) -> None:
        super().__init__()
        self.parameters = parameters


@dataclass(slots=True)
class WireTensor:
    """An output already in its wire form (BYTES length-prefixed, numbers little-endian, C order).

    A backend that answers every token (vLLM) builds its few small outputs this way: the
    worker copies ``data`` as it is, with no numpy array to make, inspect and serialize."""

    datatype: str
    shape: list[int]
    data: bytes

    def to_numpy(self) -> np.ndarray:
        count = element_count(self.shape)
        if self.datatype == "BYTES":
            return deserialize_bytes(self.data, count).reshape(self.shape)
        return np.frombuffer(self.data, dtype=numpy_dtype(self.datatype), count=count).reshape(self.shape)


# Per request: its outputs by name, or the error that fails only this request.
RequestOutcome = Mapping[str, np.ndarray | WireTensor] | ConveyorError


class AnsweredLater(ConveyorError):
    """The outcome of a request its model answers after ``execute`` returned, through the
    request's ``channel`` (a Python model's response sender, as Triton allows in the default
    mode too). An error type so that nothing is written for it; the worker keeps the channel
    open and the router keeps the request until that answer."""

    def __init__(self) -> None:
        super().__init__(Status.INTERNAL, "the model answers this request after execute returned")


def outcome_parameters(outcome: RequestOutcome | None) -> dict[str, Any] | None:
    """The response parameters an outcome carries (None: it has none)."""
    return outcome.parameters if type(outcome) is ParameterizedOutputs else None


class ResponseChannel(Protocol):
    """One request's way back while its model runs (``workers/item_stream.py``):
    whether its client went away, and, for decoupled models, responses sent as
    they are produced, from any thread."""

    cancelled: bool

    @property
    def closed(self) -> bool: ...

    def add_cancel_hook(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` (from the worker's main thread) when the request is cancelled."""
        ...

    def remove_cancel_hook(self, hook: Callable[[], None]) -> None: ...

    def reply_from(self, replies: LoopReplies) -> None:
        """Send the responses that go straight to the ingress from ``replies``'s event loop, which
        makes every later ``send`` (``workers/loop_replies.py``)."""
        ...

    def send(self, outcome: RequestOutcome | None, final: bool, output_ns: int = 0) -> None:
        """``output_ns``: the time the model itself spent producing this response's outputs, which a
        backend that times it may give (Triton's test backend ``square`` does): the response statistics
        count it as ``compute_output``, and a failed response that took it as one that had outputs."""
        ...

    def fail(self, error: ConveyorError) -> None: ...


@dataclass(slots=True)
class RequestItem:
    """One client request of a batch, as a ``RequestBackend`` gets it."""

    request_id: str
    inputs: dict[str, np.ndarray]
    outputs: list[str]  # the outputs the client asked for
    parameters: dict[str, Any]
    channel: ResponseChannel | None = None
    # A sequence-batching model's request: its slot, flags and correlation id (``workers/sequence_state.py``).
    sequence: SequenceStep | None = None


@runtime_checkable
class RequestBackend(Protocol):
    """One loaded model instance that answers each request of a batch on its own.

    ``execute_requests`` returns one outcome per item, in order; raising fails
    the whole batch. A decoupled model returns no outcomes: it answers through
    each item's ``channel``."""

    def execute_requests(self, items: list[RequestItem]) -> list[RequestOutcome]: ...

    def close(self) -> None: ...
