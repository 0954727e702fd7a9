"""Triton's gRPC messages <-> the transport-free data plane, without sockets.

Requests: ``to_infer_call`` turns a ``ModelInferRequest`` (its raw tensors
given separately as buffers, see ``wire.py``) into an ``InferCall``. Tensor data
comes either from ``raw_input_contents`` (one entry per input, in ``inputs``
order; passed on as views, never copied here) or from each input's typed
``contents`` (converted to a numpy array of the declared datatype).

Responses: ``encode_infer_response`` serializes an ``InferResult`` straight
from shared memory and releases it; ``encode_stream_error`` is the in-band
error of ModelStreamInfer.

Metadata: the router answers control calls in Triton's HTTP JSON form, which
is also protobuf's JSON mapping of the gRPC messages, so ``json_format`` does
the conversion.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format

from conveyor.ingress.dataplane import InferCall, InferResult
from conveyor.ingress.grpc import wire
from conveyor.proto import grpc_service_pb2 as pb
from conveyor.proto import model_config_pb2
from conveyor.proto._pool import POOL
from conveyor.proto.datatypes import numpy_dtype
from conveyor.proto.errors import ConveyorError, internal, invalid_arg
from conveyor.proto.request_checks import InferInput, RequestedOutput, TensorData
from conveyor.proto.shm_params import take_placement

# --- requests ----------------------------------------------------------------------

# Which datatypes each typed contents field may carry (as Triton's infer_handler.cc),
# the dtype protobuf holds them in, and the type name Triton's errors give it.
_CONTENTS: dict[str, tuple[frozenset[str], np.dtype | None, str]] = {
    "bool_contents": (frozenset({"BOOL"}), np.dtype(np.bool_), "BOOL"),
    "int_contents": (frozenset({"INT8", "INT16", "INT32"}), np.dtype("<i4"), "INT32"),
    "int64_contents": (frozenset({"INT64"}), np.dtype("<i8"), "INT64"),
    "uint_contents": (frozenset({"UINT8", "UINT16", "UINT32"}), np.dtype("<u4"), "UINT32"),
    "uint64_contents": (frozenset({"UINT64"}), np.dtype("<u8"), "UINT64"),
    "fp32_contents": (frozenset({"FP32"}), np.dtype("<f4"), "FP32"),
    "fp64_contents": (frozenset({"FP64"}), np.dtype("<f8"), "FP64"),
    "bytes_contents": (frozenset({"BYTES"}), None, "BYTES"),
}
_NARROW: dict[str, np.dtype] = {
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype("<i2"),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype("<u2"),
}

# Reserved request parameters and the InferParameter kinds they accept. gRPC keeps
# the kind (JSON cannot), so it is checked here, with Triton's wording.
_RESERVED_KINDS: dict[str, tuple[str, ...]] = {
    "sequence_id": ("int64_param", "uint64_param", "string_param"),
    "sequence_start": ("bool_param",),
    "sequence_end": ("bool_param",),
    "priority": ("int64_param", "uint64_param"),
    "timeout": ("int64_param",),
    "triton_enable_empty_final_response": ("bool_param",),
}

_SHM_PARAM = "shared_memory_region"


def to_infer_call(
    request: Any, raw: Sequence[TensorData] | None = None, *, timeout_s: float | None = None
) -> InferCall:
    """Convert a ``ModelInferRequest``.

    Args:
        request: the message. Its ``raw_input_contents`` is used when ``raw`` is None.
        raw: the raw input tensors, split off the message by ``wire.parse_infer_request``.
        timeout_s: the time left before the client's deadline, if it set one.

    Raises:
        ConveyorError: INVALID_ARG for a malformed request.
    """
    # NOTE: [:] turns protobuf's repeated fields into lists at a third of the cost
    # of list() or iteration; this function is on every request's path.
    if raw is None:
        raw = request.raw_input_contents[:]
    n_raw = len(raw)
    model = request.model_name
    tensors = request.inputs[:]
    inputs: list[InferInput] = []
    index = 0  # into raw: inputs in shared memory have no raw entry
    for tensor in tensors:
        params = _params(tensor.parameters) if tensor.parameters else {}
        if _SHM_PARAM in params:
            shm, params = take_placement(params, "input", tensor.name)
            if tensor.HasField("contents"):
                raise invalid_arg(f"input '{tensor.name}' has both contents and a shared memory region")
            inputs.append(InferInput(tensor.name, tensor.datatype, tensor.shape[:], None, params, shm))
            continue
        data: TensorData
        if n_raw:
            if tensor.HasField("contents"):
                raise invalid_arg(
                    "contents field must not be specified when using raw_input_contents "
                    f"for '{tensor.name}' for model '{model}'"
                )
            if index >= n_raw:
                raise _raw_count_error(model, n_raw, len(tensors))
            data = raw[index]
            index += 1
        elif tensor.HasField("contents"):
            data = _from_contents(tensor, model)
        else:
            raise invalid_arg(
                f"unable to find data for input tensor '{tensor.name}' for model '{model}' in request."
            )
        inputs.append(InferInput(tensor.name, tensor.datatype, tensor.shape[:], data, params))
    if n_raw and n_raw != index:
        raise _raw_count_error(model, n_raw, index)

    outputs: list[RequestedOutput] | None = None
    if request.outputs:
        outputs = [_requested_output(out) for out in request.outputs[:]]

    return InferCall(
        model=model,
        version=request.model_version,
        inputs=inputs,
        outputs=outputs,
        id=request.id,
        parameters=_request_params(request.parameters) if request.parameters else {},
        timeout_s=timeout_s,
    )


def _from_contents(tensor: Any, model: str) -> np.ndarray:
    """The typed ``contents`` of an input as a flat array of its datatype."""
    datatype = tensor.datatype
    filled = tensor.contents.ListFields()  # only the non-empty repeated fields
    if not filled:
        # An empty tensor: any field would have done.
        return np.empty(0, dtype=np.object_ if datatype == "BYTES" else numpy_dtype(datatype))
    if len(filled) > 1:
        names = ", ".join(fd.name for fd, _ in filled)
        raise invalid_arg(
            f"input tensor '{tensor.name}' for model '{model}' has data in more than one "
            f"contents field ({names})"
        )
    field, values = filled[0]
    accepts, wire_dtype, type_name = _CONTENTS[field.name]
    if datatype not in accepts:
        hint = ""
        if datatype in ("FP16", "BF16"):
            hint = " (FP16 and BF16 data can only be sent in raw_input_contents)"
        raise invalid_arg(
            f"unexpected explicit tensor data for input tensor '{tensor.name}' for model '{model}' "
            f"of type '{type_name}', expected datatype '{datatype}'{hint}"
        )
    if wire_dtype is None:  # BYTES: the data plane serializes object arrays
        array = np.empty(len(values), dtype=np.object_)
        array[:] = list(values)
        return array
    array = np.fromiter(values, dtype=wire_dtype, count=len(values))
    narrow = _NARROW.get(datatype)
    # int_contents/uint_contents hold 8/16-bit values in 32-bit slots; Triton keeps the low bytes.
    return array if narrow is None else array.astype(narrow)


def _requested_output(tensor: Any) -> RequestedOutput:
    if not tensor.parameters:
        return RequestedOutput(tensor.name)
    params = _params(tensor.parameters)
    shm, params = take_placement(params, "output", tensor.name)
    params.pop("binary_data", None)  # an HTTP notion: gRPC outputs are always binary
    count = params.pop("classification", 0)
    if isinstance(count, bool) or not isinstance(count, int):
        raise invalid_arg(
            f"invalid value type for 'classification' of output '{tensor.name}', expected int64_param"
        )
    return RequestedOutput(tensor.name, count, params, shm)


def _params(entries: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, param in entries.items():
        kind = param.WhichOneof("parameter_choice")
        if kind is None:
            raise invalid_arg(f"parameter '{key}' has no value")
        out[key] = getattr(param, kind)
    return out


def _request_params(entries: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, param in entries.items():
        kind = param.WhichOneof("parameter_choice")
        expected = _RESERVED_KINDS.get(key)
        if expected is None and key.startswith("triton_"):
            allowed = " ".join(k for k in _RESERVED_KINDS if k.startswith("triton_"))
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage. "
                f"Only the following keys starting with 'triton_' are allowed: {allowed}"
            )
        if kind is None or (expected is not None and kind not in expected):
            wanted = " or ".join(expected) if expected else "a value"
            raise invalid_arg(f"invalid value type for '{key}' parameter, expected {wanted}.")
        value = getattr(param, kind)
        if key == "priority" and value < 0:
            raise invalid_arg("invalid value for 'priority', expected value >= 0.")
        out[key] = value
    return out


def _raw_count_error(model: str, raw: int, inputs: int) -> ConveyorError:
    return invalid_arg(
        f"raw_input_contents holds {raw} tensor(s) but the request for model '{model}' "
        f"has {inputs} input(s); when raw_input_contents is used it must hold the data of every input, "
        "in the order of 'inputs'"
    )


# --- responses ---------------------------------------------------------------------


# The response parameter that tells a stream's client whether a response is its
# request's last; sent when the request set ``triton_enable_empty_final_response``.
FINAL_RESPONSE = "triton_final_response"


def encode_infer_response(result: InferResult, *, stream: bool = False, final: bool | None = None) -> bytes:
    """Serialize ``result`` as a ModelInferResponse (or, with ``stream``, as a
    ModelStreamInferResponse carrying it) and release its shared memory.

    ``final`` (when not None) is sent as the ``triton_final_response`` parameter.
    The outputs are copied once, from shared memory into the returned bytes; the
    result is released even if encoding fails.
    """
    try:
        params = b""
        if result.parameters or final is not None:
            holder = pb.ModelInferResponse()
            if result.parameters:
                set_params(holder.parameters, result.parameters)
            if final is not None:
                holder.parameters[FINAL_RESPONSE].bool_param = final
            params = holder.SerializeToString()
        outputs = result.outputs
        head = wire.infer_response_head(
            result.model, result.version, result.id, [(o.name, o.datatype, o.shape) for o in outputs], params
        )
        # An output in the client's shared memory keeps its place with no bytes, as in Triton.
        tensors = [b"" if out.raw is None else out.raw for out in outputs]
        return wire.frame_infer_response(head, tensors, stream=stream)
    finally:
        result.release()


def encode_stream_error(message: str, request_id: str, final: bool | None = None) -> bytes:
    """An in-band ModelStreamInfer error; like Triton, it echoes the request id
    (and ``final`` as ``triton_final_response`` when not None)."""
    response = pb.ModelStreamInferResponse(error_message=message)
    response.infer_response.id = request_id
    if final is not None:
        response.infer_response.parameters[FINAL_RESPONSE].bool_param = final
    return response.SerializeToString()


_INT64_MAX = (1 << 63) - 1


def set_params(target: Any, params: Mapping[str, Any]) -> None:
    """Fill an ``InferParameter`` map from python values."""
    for key, value in params.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            if value > _INT64_MAX:
                param.uint64_param = value
            else:
                param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = str(value)


# --- metadata ----------------------------------------------------------------------


def server_metadata_response(meta: Mapping[str, Any]) -> Any:
    return pb.ServerMetadataResponse(
        name=meta["name"], version=meta["version"], extensions=list(meta.get("extensions", ()))
    )


def model_metadata_response(meta: Mapping[str, Any]) -> Any:
    """``{"name", "versions", "platform", "inputs": [{name, datatype, shape}], "outputs"}``."""
    return _parse(meta, pb.ModelMetadataResponse(), "model metadata")


def model_config_response(config: Mapping[str, Any]) -> Any:
    """A model configuration in Triton's JSON form (``GET /v2/models/{m}/config``)."""
    return pb.ModelConfigResponse(config=_parse(config, model_config_pb2.ModelConfig(), "model config"))


def model_statistics_response(stats: Mapping[str, Any]) -> Any:
    """``{"model_stats": [...]}`` as served at ``GET /v2/models/stats``."""
    return _parse(stats, pb.ModelStatisticsResponse(), "model statistics")


def _parse(data: Mapping[str, Any], message: Any, what: str) -> Any:
    try:
        return json_format.ParseDict(data, message, ignore_unknown_fields=True, descriptor_pool=POOL)
    except json_format.ParseError as err:
        # A router/ingress disagreement, not the client's fault.
        raise internal(f"the router's {what} does not fit the gRPC message: {err}") from None
