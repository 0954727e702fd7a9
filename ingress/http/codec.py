"""KServe v2 / Triton HTTP inference bodies, without a transport.

Request body::

    <JSON header>[<input 0 bytes><input 1 bytes>...]

``Inference-Header-Content-Length`` gives the JSON size when binary tensor data
follows it; each binary input says how many bytes it owns with
``parameters.binary_data_size``, in the order the inputs appear in the JSON.
Those bytes reach ``InferInput.data`` as memoryview slices of the body: the only
copy is the data plane's write into shared memory.

Response body: the same layout, outputs in the order the model produced them.
An output travels as binary when its ``binary_data`` parameter says so, or, when
it does not say, when the request's ``binary_data_output`` parameter is true.
Output bytes are copied out of the worker's shared memory straight into the
response body (one ``bytes.join``), then the result is released.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from conveyor.ingress.dataplane import InferCall, InferResult, release_blocks
from conveyor.ingress.http.json_tensors import array_from_json, json_output_data
from conveyor.proto import messages as m
from conveyor.proto.datatypes import DATATYPES, element_size
from conveyor.proto.errors import ConveyorError, Status, client_mistake, invalid_arg
from conveyor.proto.request_checks import InferInput, RequestedOutput, TensorData
from conveyor.proto.shm_params import REGION, take_placement
from conveyor.shm.regions import RegionCache

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"

_DUMPS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


@dataclass(slots=True)
class HttpInferRequest:
    """A parsed request: the transport-free call plus how to render each output."""

    call: InferCall
    binary_default: bool = False  # the request's ``binary_data_output``
    binary: dict[str, bool] = field(default_factory=dict)  # per-output ``binary_data``, where given
    # The last answer rendered for a request of the same template (``header_templates``); None: no template.
    layout: AnswerLayout | None = None

    def wants_binary(self, output: str) -> bool:
        return self.binary.get(output, self.binary_default)


@dataclass(slots=True)
class HttpInferResponse:
    body: bytes
    header_length: int | None  # the JSON size when binary tensor data follows it

    @property
    def content_type(self) -> str:
        return JSON_TYPE if self.header_length is None else BINARY_TYPE


# --- requests ------------------------------------------------------------------------


def parse_header_length(value: str | None) -> int | None:
    """The ``Inference-Header-Content-Length`` header as an int (None when absent)."""
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise invalid_arg(f"Unable to parse {HEADER_LENGTH}, got: {value}") from None
    if not _INT32_MIN <= length <= _INT32_MAX:  # Triton reads it as a C int
        raise invalid_arg(
            f"Unable to parse {HEADER_LENGTH}, value is out of range [ {_INT32_MIN}, {_INT32_MAX} ], got: {value}"
        )
    return length


_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def parse_infer_request(
    body: bytes | bytearray | memoryview,
    model: str,
    version: str = "",
    header_length: int | None = None,
) -> HttpInferRequest:
    """Parse an inference request body (already decompressed).

    Raises ConveyorError(INVALID_ARG) for any malformed request, UNSUPPORTED for
    features this server does not offer (shared memory); raw binary bodies
    (header length 0) are ``raw_body``'s.
    """
    view = memoryview(body)
    total = view.nbytes
    if header_length is None:
        json_end = total
    elif header_length == 0:
        raise ConveyorError(
            Status.UNSUPPORTED,
            f"raw binary requests ({HEADER_LENGTH}: 0) need the model's signature: "
            "the app parses them with ingress.http.raw_body, not this codec",
        )
    elif header_length < 0 or header_length > total:
        raise invalid_arg(f"inference header size should be in range (0, {total}), got: {header_length}")
    else:
        json_end = header_length
    try:
        doc = orjson.loads(view[:json_end] if json_end < total else view)
    except orjson.JSONDecodeError as exc:
        raise invalid_arg(f"failed to parse the request JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise invalid_arg("the request JSON must be an object")

    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise invalid_arg("Unable to parse 'id': expected a string")
    parameters, binary_default = _request_parameters(doc.get("parameters"))
    inputs = _inputs(doc.get("inputs"), view, json_end, model, binary_ok=header_length is not None)
    outputs, binary = _outputs(doc.get("outputs"))
    call = InferCall(model, version, inputs, outputs, request_id, parameters)
    return HttpInferRequest(call, binary_default, binary)


def _request_parameters(raw: Any) -> tuple[dict[str, Any], bool]:
    if raw is None:
        return {}, False
    if not isinstance(raw, dict):
        raise invalid_arg("Unable to parse 'parameters': expected a JSON object")
    for key, value in raw.items():
        check = _RESERVED.get(key)
        if check is not None:
            if not check(value):
                raise invalid_arg(f"Unable to parse '{key}': {_RESERVED_TYPES[key]}")
        elif key.startswith("triton_"):
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )
        elif not isinstance(value, str | int | float):
            raise invalid_arg(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', 'double' or 'string'."
            )
    if "binary_data_output" not in raw:
        return raw, False
    # An HTTP rendering choice, not a request parameter: the model never sees it.
    parameters = dict(raw)
    return parameters, parameters.pop("binary_data_output")


def _is_count(v: Any) -> bool:
    return type(v) is int and v >= 0


def _is_bool(v: Any) -> bool:
    return type(v) is bool


_RESERVED = {
    "sequence_id": lambda v: _is_count(v) or isinstance(v, str),
    "sequence_start": _is_bool,
    "sequence_end": _is_bool,
    "priority": _is_count,
    "timeout": _is_count,
    "binary_data_output": _is_bool,
}
_RESERVED_TYPES = {
    "sequence_id": "expected a non-negative integer or a string",
    "sequence_start": "expected a boolean",
    "sequence_end": "expected a boolean",
    "priority": "expected a non-negative integer",
    "timeout": "expected a non-negative integer (microseconds)",
    "binary_data_output": "expected a boolean",
}


def _inputs(raw: Any, view: memoryview, json_end: int, model: str, *, binary_ok: bool) -> list[InferInput]:
    if not isinstance(raw, list):
        raise invalid_arg("Unable to parse 'inputs': the request needs an 'inputs' array")
    total = view.nbytes
    offset = json_end
    inputs: list[InferInput] = []
    for i, tensor in enumerate(raw):
        if not isinstance(tensor, dict):
            raise invalid_arg(f"Unable to parse 'inputs': input {i} is not a JSON object")
        name = tensor.get("name")
        if not isinstance(name, str):
            raise invalid_arg(f"Unable to parse 'name' of input {i}: expected a string")
        datatype = tensor.get("datatype")
        if not isinstance(datatype, str) or datatype not in DATATYPES:
            raise invalid_arg(f"Unable to parse 'datatype' of input '{name}': got {datatype!r}")
        shape = tensor.get("shape")
        if not isinstance(shape, list):
            raise invalid_arg("Unable to parse 'shape': attempt to access JSON non-array as array")
        if not all(_is_count(d) for d in shape):
            # Triton answers 500 (its JSON reader's INTERNAL)
            raise client_mistake(
                "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"
            )
        params = _parameters(tensor, "input", name)
        size = params.get("binary_data_size")
        data: TensorData
        if REGION in params:
            if "data" in tensor or size is not None:
                found = " ".join(f for f, there in (("'data'", "data" in tensor),
                                                    ("'binary_data_size'", size is not None)) if there)
                raise _one_source(name, f"{found} 'shared_memory_region'")
            shm, params = take_placement(params, "input", name)
            inputs.append(InferInput(name, datatype, shape, None, params, shm))
            continue
        if size is not None:
            if "data" in tensor:
                raise _one_source(name, "'data' 'binary_data_size'")
            if not binary_ok:
                raise invalid_arg(
                    f"must specify valid '{HEADER_LENGTH}' in request header and 'binary_data_size' "
                    "when passing inputs in binary data format"
                )
            if not _is_count(size):
                raise invalid_arg(
                    f"Unable to parse 'binary_data_size' of input '{name}': expected a non-negative integer"
                )
            end = offset + size
            if end > total:
                raise invalid_arg(
                    f"unexpected size for input '{name}', expecting {end - total} additional bytes for "
                    f"model '{model}': the body is truncated or 'binary_data_size' is wrong"
                )
            data = view[offset:end]
            offset = end
            params = _without(params, "binary_data_size")
        elif "data" in tensor:
            _check_json_size(name, datatype, shape)
            data = array_from_json(name, datatype, tensor["data"])
            inputs.append(InferInput(name, datatype, shape, data, params, from_json=True))
            continue
        else:
            raise _one_source(name, None)
        inputs.append(InferInput(name, datatype, shape, data, params))
    if offset != total:
        raise invalid_arg(
            f"unexpected additional input data for model '{model}': {total - offset} bytes follow the "
            "binary inputs (the 'binary_data_size' values add up to less than the body holds)"
        )
    return inputs


def _check_json_size(name: str, datatype: str, shape: list[int]) -> None:
    """Triton's overflow checks on a JSON input's shape, before its data is read."""
    count = 1
    for d in shape:
        count *= d
    if count > _INT64_MAX:
        raise invalid_arg(
            f"invalid shape for input '{name}': shape [{','.join(map(str, shape))}] causes total element count "
            f"to exceed maximum size of {_INT64_MAX}"
        )
    size = element_size(datatype)  # 0 for BYTES: sized from its data
    if size > 1 and count > _INT64_MAX // size:
        raise invalid_arg(
            f"byte size overflow for input '{name}': element count ({count}) * data type size ({size}) exceeds "
            f"maximum allowed size ({_INT64_MAX})"
        )


_INT64_MAX = (1 << 63) - 1


def _outputs(raw: Any) -> tuple[list[RequestedOutput] | None, dict[str, bool]]:
    # Absent or empty: every output, as Triton does.
    if raw is None or raw == []:
        return None, {}
    if not isinstance(raw, list):
        raise invalid_arg("Unable to parse 'outputs': expected a JSON array")
    outputs: list[RequestedOutput] = []
    binary: dict[str, bool] = {}
    for i, tensor in enumerate(raw):
        if not isinstance(tensor, dict):
            raise invalid_arg(f"Unable to parse 'outputs': output {i} is not a JSON object")
        name = tensor.get("name")
        if not isinstance(name, str):
            raise invalid_arg(f"Unable to parse 'name' of output {i}: expected a string")
        shm, params = take_placement(_parameters(tensor, "output", name), "output", name)
        classification = params.get("classification", 0)
        if not _is_count(classification):
            raise invalid_arg(f"Unable to parse 'classification' of output '{name}': expected a non-negative integer")
        wants_binary = params.get("binary_data")
        if wants_binary is not None:
            if not _is_bool(wants_binary):
                raise invalid_arg(f"Unable to parse 'binary_data' of output '{name}': expected a boolean")
            binary[name] = wants_binary
        rest = _without(params, "binary_data", "classification")
        outputs.append(RequestedOutput(name, classification, rest, shm))
    return outputs, binary


def _parameters(tensor: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    params = tensor.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise invalid_arg(f"Unable to parse 'parameters' of {kind} '{name}': expected a JSON object")
    return params


def _without(params: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``params`` less the protocol keys, copying only when something else is left."""
    if all(k in keys for k in params):
        return {}
    return {k: v for k, v in params.items() if k not in keys}


def _one_source(name: str, found: str | None) -> ConveyorError:
    but = f"set {found}" if found else "no field is set"
    return invalid_arg(
        f"Input '{name}' must set only one of the following fields: 'data', 'binary_data_size' in "
        f"'parameters', 'shared_memory_region' in 'parameters'. But {but}"
    )


# --- responses -----------------------------------------------------------------------


def build_infer_response(result: InferResult, request: HttpInferRequest) -> HttpInferResponse:
    """Render ``result`` and release it (always, also when rendering fails).

    The output views point into the worker's shared memory: everything that
    reads them (JSON serialization, the body join) happens before the release.
    """
    try:
        outputs: list[dict[str, Any]] = []
        binary: list[memoryview] = []
        wants, default = request.binary, request.binary_default  # ``wants_binary``, inline
        for out in result.outputs:
            entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": out.shape}
            raw = out.raw
            if raw is None:
                pass  # written into the client's shared memory: no data, as in Triton
            elif wants.get(out.name, default) if wants else default:
                nbytes = raw.nbytes
                entry["parameters"] = {"binary_data_size": nbytes}
                if nbytes:
                    binary.append(raw.data)
            else:
                entry["data"] = json_output_data(out)
            outputs.append(entry)
        doc: dict[str, Any] = {"model_name": result.model, "model_version": result.version}
        if result.id:
            doc["id"] = result.id
        if result.parameters:
            doc["parameters"] = result.parameters
        doc["outputs"] = outputs
        header = orjson.dumps(doc, default=_to_list, option=_DUMPS_OPTIONS)
        if not binary:
            # As Triton: no binary bytes, no Inference-Header-Content-Length.
            return HttpInferResponse(header, None)
        return HttpInferResponse(b"".join([header, *binary]), len(header))
    finally:
        result.release()


class AnswerLayout:
    """The last answer rendered for the requests of one template (``header_templates``), when it is
    all JSON header and binary bytes: its JSON header and the HTTP head lines that depend on it.

    The requests of a template render their answers alike (the same id, the same ``binary_data``
    choices), so an answer whose model, version and outputs (name, datatype, shape, byte size, and
    whether they lie in a client's region) are those of the last one has the same JSON header: only
    the output bytes are new (``body``). Anything else (another layout, response parameters, an
    output rendered as JSON) is rendered afresh by ``build_infer_response``; ``keep`` remembers it.
    """

    __slots__ = ("head", "header", "model", "outputs", "version")

    def __init__(self) -> None:
        self.model = self.version = ""
        self.outputs: list[tuple[str, str, list[int], int, bool]] = []  # name, datatype, shape, nbytes, client's
        self.header = b""  # the JSON header
        self.head = b""  # the HTTP head lines the transport adds for this header (``keep``'s caller's)

    def body(self, response: m.InferResponse, regions: RegionCache) -> bytes | None:
        """``response``'s body (its output block released then), or None when it is not laid out as the
        last one (nothing done then). ``response`` has no error."""
        if (response.model != self.model or response.version != self.version or response.parameters
                or not self.head):
            return None
        layout, outputs = self.outputs, response.outputs
        if len(outputs) != len(layout):
            return None
        parts: list[bytes | memoryview] = [self.header]
        for t, (name, datatype, shape, nbytes, client) in zip(outputs, layout, strict=False):  # lengths compared
            if (t.nbytes != nbytes or t.name != name or t.shape != shape or t.datatype != datatype
                    or t.region.startswith(_CLIENT) is not client):
                return None
            if nbytes and not client:
                parts.append(regions.span(t.region, t.offset, nbytes))  # raises as ``DataPlane.result`` would
        try:
            return b"".join(parts)
        finally:
            release_blocks(regions, response.release)

    def keep(self, response: m.InferResponse, result: InferResult, request: HttpInferRequest,
             rendered: HttpInferResponse) -> bool:
        """Remember ``rendered``, the answer to ``request`` made of ``result`` (``response``'s), when the
        next answer may reuse it: nothing but binary outputs and no parameters. The caller then sets
        ``head``, the HTTP head lines that go with it; until then nothing is reused."""
        self.head = b""
        if result.parameters:
            return False
        wants, default = request.binary, request.binary_default
        for out in result.outputs:
            if out.raw is not None and not wants.get(out.name, default):
                return False  # data in the JSON
        self.model, self.version = response.model, response.version
        self.outputs = [(t.name, t.datatype, list(t.shape), t.nbytes, t.region.startswith(_CLIENT))
                        for t in response.outputs]
        body = rendered.body
        self.header = body if rendered.header_length is None else body[:rendered.header_length]
        return True


_CLIENT = m.CLIENT_REGION_PREFIX


def _to_list(obj: Any) -> Any:
    """orjson fallback for arrays it cannot serialize natively."""
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def encode_json(doc: Any) -> bytes:
    return orjson.dumps(doc, default=_to_list, option=_DUMPS_OPTIONS)
