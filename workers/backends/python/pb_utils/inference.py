"""Requests and responses as ``TritonPythonModel.execute`` sees them."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from conveyor.proto.errors import ConveyorError, Status, internal
from conveyor.workers.backends.base import ParameterizedOutputs, RequestOutcome, ResponseChannel, WireTensor
from conveyor.workers.backends.python.pb_utils import bls
from conveyor.workers.backends.python.pb_utils.errors import TritonError, TritonModelException
from conveyor.workers.backends.python.pb_utils.options import InferenceTrace, PreferredMemory
from conveyor.workers.backends.python.pb_utils.tensor import Tensor

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# Request parameters Triton consumes itself and does not hand to the model.
_RESERVED_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output"}
)
_REQUIRED: Any = object()  # an argument Triton's binding has no default for
_NO_PARAMETERS: dict[str, Any] = {}  # shared, never mutated: most requests and responses have none


def parameters_dict(parameters: dict[str, Any] | str | None) -> dict[str, Any]:
    """``parameters=`` of a request or response, checked as Triton checks it: a dict
    (or its JSON text) of str keys to bool, int or str values."""
    if parameters is None:
        return _NO_PARAMETERS
    if isinstance(parameters, str):
        try:
            parameters = json.loads(parameters)
        except ValueError as exc:
            raise TritonModelException(f"parameters is not valid JSON: {exc}") from None
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect parameters to be a dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, bool | int | str):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return dict(parameters) if parameters else _NO_PARAMETERS


class InferenceResponse:
    """``InferenceResponse(output_tensors=[...], error=None, parameters=None)``: a
    response with an error fails only its own request, and its tensors are
    ignored; ``parameters`` (str -> bool/int/str) go to the client as the
    response's parameters."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] = (),
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        # Triton's binding: a list it cannot convert (None) is a TypeError, a member that is not
        # a Tensor (None) a TritonModelException.
        if not isinstance(output_tensors, (list, tuple)):  # the tuple form: a faster check than list | tuple
            raise TypeError(f'"output_tensors" must be a list of pb_utils.Tensor, not {type(output_tensors).__name__}')
        for tensor in output_tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"output_tensors must be pb_utils.Tensor objects, got {type(tensor).__name__}"
                )
        self._outputs = list(output_tensors)
        self._error = error
        self._parameters = _NO_PARAMETERS if parameters is None else parameters_dict(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response's parameters as a JSON string, as in Triton."""
        return json.dumps(self._parameters)


class InferenceResponseSender:
    """``request.get_response_sender()``.

    A decoupled model sends any number of responses (none included), from
    ``execute`` or any thread; each goes to the client at once, and
    ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` ends the request.

    In the default mode a request takes exactly one response, as in Triton: sent
    during ``execute`` (which then returns None for it), returned by ``execute``, or
    sent after ``execute`` returned (from a thread or an asyncio task the model
    started); the final flag may come with it or after it. Triton's checks and
    words: a second response, a final flag before any response, anything after
    the final flag raise ``TritonModelException``."""

    def __init__(self, channel: ResponseChannel | None = None, decoupled: bool = False) -> None:
        self.closed = False
        self._channel = channel
        self._decoupled = decoupled and channel is not None
        # The default mode's state (Triton's ResponseSender counters): the one response sent,
        # how many sends were counted, whether execute returned leaving the request to the
        # sender, and whether the response left with execute's outcome already.
        self._response: InferenceResponse | None = None
        self._sent = 0
        self._later = False
        self._delivered = False
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is None and not final:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(f"send() takes an InferenceResponse, not a {type(response).__name__}")
        if self._decoupled:
            self._stream(response, final)
            return
        with self._lock:
            self._count(response, final)
            deliver = self._later and final and not self._delivered
            self._delivered |= deliver
        if deliver:  # after execute returned: the request is answered now
            assert self._channel is not None
            try:
                self._channel.send(response_outcome(self._response), True)
            except ConveyorError:
                raise TritonModelException("Unable to send response. Response sender has been closed.") from None

    def _count(self, response: InferenceResponse | None, final: bool) -> None:
        """One send in the default mode, checked as Triton's ``UpdateStateAndCounters``."""
        if response is not None and self._sent > 0:
            raise TritonModelException(
                "Unable to send response. Non-decoupled model cannot send more than one response."
            )
        if response is None and final and self._sent == 0:
            raise TritonModelException(
                "Unable to send response. Non-decoupled model cannot send complete final before sending a response."
            )
        if self.closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if final:
            self.closed = True
        if response is not None:
            self._response = response
        self._sent += 1

    def returned(self, response: InferenceResponse) -> None:
        """``execute`` returned ``response`` for this request: it counts as sent with the final
        flag (raises as ``send`` would, e.g. when the sender already sent one)."""
        with self._lock:
            self._count(response, True)
            self._delivered = True

    def settle(self) -> InferenceResponse | None:
        """``execute`` returned nothing for this request: the response sent during it, or None,
        and then the request waits for the sender (``answers_later``), when it has a channel."""
        with self._lock:
            if self._response is not None:
                self._delivered = True
                return self._response
            self._later = self._channel is not None
            return None

    def take_sent(self) -> InferenceResponse | None:
        """``execute`` failed: the response already sent, which the request keeps."""
        with self._lock:
            self._delivered = self._response is not None
            return self._response

    @property
    def answers_later(self) -> bool:
        return self._later

    def _stream(self, response: InferenceResponse | None, final: bool) -> None:
        assert self._channel is not None
        if self.closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        try:
            self._channel.send(None if response is None else response_outcome(response), final)
        except ConveyorError:
            self.closed = True
            raise TritonModelException("Unable to send response. Response sender has been closed.") from None
        if final:
            self.closed = True

    def fail(self, message: str) -> None:
        """End a decoupled request with an error unless the model ended it."""
        if self._channel is not None and not self._channel.closed:
            self._channel.fail(internal(message))
        self.closed = True

    def is_cancelled(self) -> bool:
        return self._channel is not None and self._channel.cancelled


class InferenceRequest:
    """A request: one the server hands to ``execute`` (its own inputs, with their
    own batch dimension, the outputs it asked for and its parameters), or one a
    model builds to call a model through the server (BLS, ``exec``).

    The constructor takes Triton's arguments in Triton's order; ``inputs``,
    ``requested_output_names`` and ``model_name`` are what a BLS request needs.
    """

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Sequence[Tensor] = _REQUIRED,
        requested_output_names: Sequence[str] = _REQUIRED,
        model_name: str = _REQUIRED,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        # Triton's binding refuses what it cannot convert with TypeError (None included, and a
        # missing inputs, requested_output_names or model_name: they have no default there),
        # and a correlation id of another type with its own exception.
        missing = [n for n, v in (("inputs", inputs), ("requested_output_names", requested_output_names),
                                  ("model_name", model_name)) if v is _REQUIRED]
        if missing:
            raise TypeError(f"InferenceRequest() is missing the argument(s) {', '.join(missing)}")
        if correlation_id is None:
            raise TypeError("correlation_id must be an int or a str, not None")
        if not isinstance(correlation_id, int | str) or isinstance(correlation_id, bool):
            raise TritonModelException("Correlation ID must be integer or string")
        _typed("request_id", request_id, str)
        _typed("model_name", model_name, str)
        _typed("model_version", model_version, int)
        _typed("flags", flags, int)
        _typed("timeout", timeout, int)
        if not isinstance(inputs, list | tuple):
            raise TypeError(f"inputs must be a list of pb_utils.Tensor, not {type(inputs).__name__}")
        if not isinstance(requested_output_names, list | tuple) or not all(
            isinstance(n, str) for n in requested_output_names
        ):
            raise TypeError("requested_output_names must be a list of str")
        for tensor in inputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(f"inputs must be pb_utils.Tensor objects, got {type(tensor).__name__}")
        self._setup(
            model_name, model_version, list(inputs), list(requested_output_names), request_id, correlation_id,
            flags, timeout, parameters_dict(parameters),
        )
        self._preferred_memory = preferred_memory  # accepted; BLS outputs are CPU numpy arrays either way
        self._trace = trace

    def _setup(
        self, model_name: str, model_version: int, inputs: list[Tensor], requested: list[str], request_id: str,
        correlation_id: int | str, flags: int, timeout: int, parameters: dict[str, Any],
    ) -> None:
        self._model_name = model_name
        self._model_version = model_version
        self._inputs = inputs
        self._requested = requested
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters
        self._sender: InferenceResponseSender | None = None
        self._channel: ResponseChannel | None = None
        self._decoupled = False
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def received(
        cls, model_name: str, model_version: int, inputs: list[Tensor], requested_output_names: list[str],
        request_id: str, parameters: dict[str, Any], channel: ResponseChannel | None = None,
        decoupled: bool = False,
    ) -> InferenceRequest:
        """A request as the server hands it to ``execute``: Triton's reserved
        parameters become the correlation id, flags and timeout; ``channel``
        carries cancellation and a decoupled model's responses."""
        request = cls.__new__(cls)  # the server's values need none of the constructor's checks
        flags, timeout, model_params = 0, 0, _NO_PARAMETERS
        if parameters:
            flags = (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if parameters.get("sequence_start") else 0) | (
                TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if parameters.get("sequence_end") else 0
            )
            wire_timeout = parameters.get("timeout", 0)
            timeout = wire_timeout if isinstance(wire_timeout, int) else 0
            model_params = {
                k: v for k, v in parameters.items() if k not in _RESERVED_PARAMETERS and not k.startswith("triton_")
            }
        request._setup(
            model_name, model_version, inputs, requested_output_names, request_id,
            parameters.get("sequence_id", 0) if parameters else 0, flags, timeout, model_params,
        )
        request._channel = channel
        request._decoupled = decoupled
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        """The sequence flags of a BLS request (``TRITONSERVER_REQUEST_FLAG_SEQUENCE_*``)."""
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def parameters(self) -> str:
        """The request's parameters as a JSON string, written as Triton writes it (compact, UTF-8)."""
        return json.dumps(self._parameters, separators=(",", ":"), ensure_ascii=False)

    def trace(self) -> InferenceTrace:
        """Conveyor does not hand trace contexts to models: ``get_context()`` is None."""
        return getattr(self, "_trace", None) or InferenceTrace()

    def requested_output_names(self) -> list[str]:
        return self._requested

    def is_cancelled(self) -> bool:
        """True once the client went away (the router forwards its Cancel to the worker)."""
        return self._channel is not None and self._channel.cancelled

    def sender_if_any(self) -> InferenceResponseSender | None:
        """The response sender, if the model asked for it (Conveyor's; most requests have none)."""
        return self._sender

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            self._sender = InferenceResponseSender(self._channel, self._decoupled)
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        """``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``: when ``execute`` returns, this request
        (returned as None) is executed again, on the same instance, in an ``execute`` of its
        own; ``TRITONSERVER_REQUEST_RELEASE_ALL`` (the default) releases it."""
        self._release_flags = flags

    def release_flags(self) -> int:
        return self._release_flags

    def rescheduled(self) -> bool:
        """Set to be executed again (the Python backend's loop); the flag is spent by asking."""
        if self.release_flags() & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
            return True
        return False

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` (BLS) and wait: its response, or with
        ``decoupled`` an iterator of every response (the last one final, maybe
        empty). A callee's error comes back in the response, not raised."""
        bls.check_allowed()
        if decoupled:
            return bls.executor().stream(self)
        return bls.executor().infer(self)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` as an awaitable: several may run at once (``asyncio.gather``); with
        ``decoupled``, the iterator once the callee's first response is in."""
        bls.check_allowed()
        if decoupled:
            return await bls.executor().stream_async(self)
        return await bls.executor().infer_async(self)


def _typed(name: str, value: object, kind: type) -> None:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"{name} must be a {kind.__name__}, not {type(value).__name__}")


def bls_parameters(request: InferenceRequest) -> dict[str, Any]:
    """What a BLS request carries to the router as its parameters: the model's own
    plus the sequence fields its correlation id and flags stand for."""
    params = dict(request._parameters)
    if request.correlation_id():
        params["sequence_id"] = request.correlation_id()
    flags = request.flags()
    if flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
        params["sequence_start"] = True
    if flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
        params["sequence_end"] = True
    return params


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():  # a loop: a generator cost as much as the search (every model calls it)
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)


def response_outcome(response: InferenceResponse | None) -> RequestOutcome:
    """What a response means for its request: outputs by name (with the response's
    parameters when it has some), or its error."""
    if response is None:
        return internal("the model sent no response for this request")
    error = response._error  # its fields, not its methods: once per request
    if error is not None:
        try:
            status = Status(error.code())
        except ValueError:
            status = Status.INTERNAL
        return ConveyorError(status, error.message())
    outputs: dict[str, Any] = ParameterizedOutputs(response._parameters) if response._parameters else {}
    for tensor in response._outputs:
        if type(tensor) is Tensor and not tensor._bf16:  # the usual tensor: what the general path reads, directly
            outputs[tensor._name] = tensor._array
            continue
        if not isinstance(tensor, Tensor):
            return internal(f"the model's response holds a {type(tensor).__name__}, not a pb_utils.Tensor")
        if tensor.is_bf16():  # numpy has no BF16: its words go as they are, named BF16 (one copy)
            words = tensor.data()
            outputs[tensor.name()] = WireTensor("BF16", list(words.shape), words.tobytes())
            continue
        outputs[tensor.name()] = tensor.data()  # a device tensor stays a cupy array: the worker copies it
    return outputs
