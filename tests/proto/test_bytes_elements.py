"""A BYTES tensor made from an object array holding numbers and booleans: each element is its text, as Triton's
Python backend serializes one (L0_parameters' model answers a request's parameters this way)."""

from __future__ import annotations

import numpy as np

from conveyor.proto.datatypes import deserialize_bytes, serialize_bytes

LEVEL = "unit"


def test_numbers_in_an_object_array_are_their_text() -> None:
    values = np.asarray([1, 123.123, True, "é", b"\x00raw", np.bytes_(b"np"), bytearray(b"ba")], dtype=object)
    assert deserialize_bytes(serialize_bytes(values), len(values)).tolist() == [
        b"1", b"123.123", b"True", "é".encode(), b"\x00raw", b"np", b"ba"]
