"""KServe v2 datatypes: their numpy dtypes, config names and the BYTES wire form.

A BYTES tensor travels (HTTP binary data, gRPC raw contents, shared memory) as
each element's 4-byte little-endian length followed by its bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np

from conveyor.proto.errors import invalid_arg

# BF16 has no numpy dtype: it travels as raw 2-byte words.
_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
    "BYTES": np.dtype(np.object_),
}

DATATYPES = frozenset(_NUMPY)

_FROM_NUMPY: dict[np.dtype, str] = {dt: name for name, dt in _NUMPY.items() if name != "BF16"}


def numpy_dtype(datatype: str) -> np.dtype:
    try:
        return _NUMPY[datatype]
    except KeyError:
        raise invalid_arg(f"unknown datatype '{datatype}'") from None


def datatype_of(array: np.ndarray) -> str:
    """The KServe datatype of a numpy array (strings and bytes map to BYTES)."""
    dt = array.dtype
    if dt.kind in "OSU":
        return "BYTES"
    found = _FROM_NUMPY.get(dt.newbyteorder("<") if dt.byteorder == ">" else dt)
    if found is None:
        raise invalid_arg(f"unsupported numpy dtype {dt}")
    return found


def element_size(datatype: str) -> int:
    """Bytes per element, or 0 for BYTES (variable length)."""
    if datatype == "BYTES":
        return 0
    return numpy_dtype(datatype).itemsize


def config_to_datatype(config_type: str) -> str:
    """'TYPE_FP32' -> 'FP32'; 'TYPE_STRING' -> 'BYTES'."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def datatype_to_config(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype


def element_count(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


_LENGTH = struct.Struct("<I")


def serialize_bytes(array: np.ndarray) -> bytes:
    """Flatten an object/bytes/str array into the length-prefixed wire form."""
    return pack_bytes([_element_bytes(item) for item in array.reshape(-1)])


def _element_bytes(item: object) -> bytes:
    """One BYTES element: bytes as they are, text in UTF-8, anything else as its text (a number: its digits), as
    Triton's Python backend serializes an object array (``str(x).encode()``; ``bytes(1)`` would be a zero byte)."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    return str(item).encode("utf-8")


def pack_bytes(elements: list[bytes]) -> bytes:
    """``elements`` in the length-prefixed wire form."""
    pack = _LENGTH.pack
    if len(elements) == 1:  # a token's text: the common case
        return pack(len(elements[0])) + elements[0]
    parts: list[bytes] = []
    for b in elements:
        parts.append(pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def deserialize_bytes(buf: memoryview | bytes, count: int) -> np.ndarray:
    """Parse ``count`` length-prefixed elements; error if the buffer does not hold exactly that."""
    out = np.empty(count, dtype=np.object_)
    out[:] = split_bytes(buf, count)  # each element stays the bytes object it is
    return out


def split_bytes(buf: memoryview | bytes, count: int) -> list[bytes]:
    """``deserialize_bytes`` as a list, for readers that want no array."""
    mv = memoryview(buf)
    out: list[bytes] = []
    unpack = _LENGTH.unpack_from
    pos, end = 0, len(mv)
    for _ in range(count):
        if pos + 4 > end:
            raise invalid_arg(f"BYTES tensor data holds fewer than the {count} elements its shape implies")
        (n,) = unpack(mv, pos)
        pos += 4
        if pos + n > end:
            raise invalid_arg("BYTES tensor element length runs past the end of its data")
        out.append(bytes(mv[pos : pos + n]))
        pos += n
    if pos != end:
        raise invalid_arg(f"BYTES tensor data holds more than the {count} elements its shape implies")
    return out
