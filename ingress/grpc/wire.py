"""Zero-copy protobuf framing for the two infer RPCs.

Tensor bytes are most of an infer message, and protobuf's Python runtime copies
a ``bytes`` field twice: into its arena when parsing, and into a new ``bytes``
object on every access (the same on the way out: append, then serialize). So
the ModelInfer/ModelStreamInfer handlers are registered with these functions
instead of the generated (de)serializers:

* ``parse_infer_request`` walks the top-level fields of a ``ModelInferRequest``
  (a handful of tags), hands ``raw_input_contents`` back as memoryviews of the
  received buffer and lets protobuf parse only the rest (names, shapes,
  parameters: a few hundred bytes). Small messages skip the walk: it costs a
  few microseconds of Python, more than copying a few KiB.
* ``frame_infer_response`` appends ``raw_output_contents`` to a serialized
  header in one ``bytes.join``, so each output is copied exactly once, from
  shared memory into the message grpc sends. ``infer_response_head`` writes
  that header itself: the description of an output (name, datatype, shape)
  repeats from one response to the next, so its bytes are kept, and a response
  costs a few dictionary look-ups instead of building protobuf objects.

Protobuf's wire format is stable and documented
(https://protobuf.dev/programming-guides/encoding/); the two field numbers used
here are fixed by Triton's ``grpc_service.proto``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from conveyor.proto import grpc_service_pb2 as pb

# Field numbers from grpc_service.proto (pinned by tests against the descriptors).
RAW_INPUT_CONTENTS = 7  # ModelInferRequest.raw_input_contents
RAW_OUTPUT_CONTENTS = 6  # ModelInferResponse.raw_output_contents
STREAM_INFER_RESPONSE = 2  # ModelStreamInferResponse.infer_response
# ModelInferResponse's other fields, in the order protobuf writes them.
RESPONSE_MODEL_NAME, RESPONSE_MODEL_VERSION, RESPONSE_ID, RESPONSE_OUTPUTS = 1, 2, 3, 5
# ModelInferResponse.InferOutputTensor
OUTPUT_NAME, OUTPUT_DATATYPE, OUTPUT_SHAPE = 1, 2, 3

_LENGTH_DELIMITED = 2
_RAW_OUTPUT_KEY = bytes([RAW_OUTPUT_CONTENTS << 3 | _LENGTH_DELIMITED])
_STREAM_RESPONSE_KEY = bytes([STREAM_INFER_RESPONSE << 3 | _LENGTH_DELIMITED])

Buffer = Any  # anything bytes-like: bytes, memoryview, a contiguous numpy uint8 view


# Below this size protobuf's own parse (and copies) beat the walk.
SPLIT_MIN_BYTES = 32 << 10


@dataclass(slots=True)
class WireInferRequest:
    """A ModelInferRequest and its raw input tensors, in order. ``raw`` is what
    to read: for large messages it holds views of the buffer grpc received and
    ``message.raw_input_contents`` is empty."""

    message: Any  # grpc_service_pb2.ModelInferRequest
    raw: Sequence[bytes | memoryview]
    # The call made of it, when the task-free path made one and then left the call to a task.
    call: Any = None  # dataplane.InferCall


class _Malformed(Exception):
    pass


def parse_infer_request(buf: bytes) -> WireInferRequest:
    """grpc request deserializer for ModelInfer and ModelStreamInfer."""
    if len(buf) < SPLIT_MIN_BYTES:
        message = pb.ModelInferRequest.FromString(buf)
        return WireInferRequest(message, message.raw_input_contents[:])  # [:] is a list, quickly
    try:
        rest, raw = _split_field(buf, RAW_INPUT_CONTENTS)
    except _Malformed:
        # Let protobuf judge (and word the error for) what the walk could not read.
        message = pb.ModelInferRequest.FromString(buf)
        return WireInferRequest(message, message.raw_input_contents[:])
    # protobuf parses any buffer, a memoryview included.
    return WireInferRequest(pb.ModelInferRequest.FromString(cast(bytes, rest)), raw)


def frame_infer_response(head: bytes, tensors: Sequence[Buffer], *, stream: bool = False) -> bytes:
    """A serialized ModelInferResponse: ``head`` (the response without raw
    contents) followed by one ``raw_output_contents`` entry per tensor. With
    ``stream`` it is wrapped as ``ModelStreamInferResponse.infer_response``."""
    parts: list[Buffer] = [b"", head]
    size = len(head)
    for tensor in tensors:
        nbytes = memoryview(tensor).nbytes
        key = _RAW_OUTPUT_KEY + _encode_varint(nbytes)
        parts.append(key)
        parts.append(tensor)
        size += len(key) + nbytes
    if stream:
        parts[0] = _STREAM_RESPONSE_KEY + _encode_varint(size)
    return b"".join(parts)


def infer_response_head(model: str, version: str, request_id: str, outputs: Sequence[tuple[str, str, Sequence[int]]],
                        parameters: bytes = b"") -> bytes:
    """A ModelInferResponse without raw contents, byte for byte what protobuf
    writes: ``parameters`` is the serialized ``parameters`` field (protobuf's
    own, from a message holding nothing else), ``outputs`` (name, datatype,
    shape) per output."""
    head = _MODEL_HEADS.get((model, version))
    if head is None:
        head = _string_field(RESPONSE_MODEL_NAME, model) + _string_field(RESPONSE_MODEL_VERSION, version)
        _remember(_MODEL_HEADS, (model, version), head)
    parts = [head, _string_field(RESPONSE_ID, request_id) if request_id else b"", parameters]
    for name, datatype, shape in outputs:
        key = (name, datatype, *shape)
        described = _OUTPUT_HEADS.get(key)
        if described is None:
            described = _length_delimited(RESPONSE_OUTPUTS, _output_tensor(name, datatype, shape))
            _remember(_OUTPUT_HEADS, key, described)
        parts.append(described)
    return b"".join(parts)


# Models and outputs seen lately, as bytes; emptied when full (shapes may vary).
_CACHE_ENTRIES = 4096
_MODEL_HEADS: dict[tuple[str, str], bytes] = {}
_OUTPUT_HEADS: dict[tuple[Any, ...], bytes] = {}


def _remember(cache: dict[Any, bytes], key: Any, value: bytes) -> None:
    if len(cache) >= _CACHE_ENTRIES:
        cache.clear()
    cache[key] = value


def _output_tensor(name: str, datatype: str, shape: Sequence[int]) -> bytes:
    body = _string_field(OUTPUT_NAME, name) + _string_field(OUTPUT_DATATYPE, datatype)
    if len(shape):
        # int64 is written as its 64-bit two's complement (a negative takes 10 bytes).
        packed = b"".join(_encode_varint(d & _UINT64) for d in shape)
        body += _length_delimited(OUTPUT_SHAPE, packed)
    return body


_UINT64 = (1 << 64) - 1


def _string_field(field: int, value: str) -> bytes:
    """A proto3 string field; the empty string is not written."""
    return _length_delimited(field, value.encode()) if value else b""


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _encode_varint(field << 3 | _LENGTH_DELIMITED) + _encode_varint(len(payload)) + payload


def _split_field(buf: bytes, field: int) -> tuple[bytes | memoryview, list[memoryview]]:
    """Take every occurrence of length-delimited ``field`` out of the top level
    of ``buf``; return the remaining bytes (a view when they are contiguous,
    which is the usual case: serializers write fields in number order and the
    raw contents have the highest number) and the field's payloads."""
    mv = memoryview(buf)
    end = len(buf)
    found: list[memoryview] = []
    kept: list[memoryview] = []
    pos = run = 0
    while pos < end:
        start = pos
        key, pos = _decode_varint(buf, pos)
        wire_type = key & 7
        if wire_type == _LENGTH_DELIMITED:
            size, pos = _decode_varint(buf, pos)
            stop = pos + size
            if stop > end:
                raise _Malformed
            if key >> 3 == field:
                if start > run:
                    kept.append(mv[run:start])
                found.append(mv[pos:stop])
                run = stop
            pos = stop
        elif wire_type == 0:
            _, pos = _decode_varint(buf, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:  # groups: never in this message
            raise _Malformed
    if pos != end:
        raise _Malformed
    if not found:
        return buf, found
    if run < end:
        kept.append(mv[run:end])
    if len(kept) == 1:
        return kept[0], found
    return b"".join(kept), found


def _decode_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    try:
        while True:
            byte = buf[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result, pos
            shift += 7
            if shift >= 64:
                raise _Malformed
    except IndexError:
        raise _Malformed from None


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
