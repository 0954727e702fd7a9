"""Inputs as a worker's backends see them: arrays over the bytes where the ingress put them, of the
request's datatype and shape, and the errors for a descriptor that does not fit its segment or shape."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from conveyor.proto import messages as m
from conveyor.proto.datatypes import serialize_bytes
from conveyor.proto.errors import ConveyorError, Status
from conveyor.shm.arena import Arena
from conveyor.shm.regions import RegionCache
from conveyor.workers.batch_io import TensorViews
from conveyor.workers.client_regions import ClientRegionMaps

LEVEL = "unit"


@pytest.fixture
def arena() -> Iterator[Arena]:
    a = Arena(f"/conveyor.test.views.{os.getpid()}", 1 << 16)
    yield a
    a.close()


def put(arena: Arena, data: bytes) -> int:
    start = arena.alloc(max(len(data), 1))
    arena.put(start, data)
    return start


@pytest.mark.parametrize(("datatype", "array"), [
    ("BOOL", np.array([[True, False]])),
    ("UINT8", np.arange(4, dtype=np.uint8)),
    ("INT32", np.arange(6, dtype="<i4").reshape(2, 3)),
    ("INT64", np.array(7, dtype="<i8")),  # a scalar: shape []
    ("FP16", np.array([0.5, 2.0], dtype="<f2")),
    ("FP64", np.zeros((0, 3), dtype="<f8")),  # empty
    ("BF16", np.array([0x3F80, 0x4000], dtype="<u2")),  # raw 16-bit words
])
def test_inputs_are_arrays_over_the_arena_of_their_datatype_and_shape(arena: Arena, datatype: str,
                                                                       array: np.ndarray) -> None:
    start = put(arena, array.tobytes())
    views = TensorViews(RegionCache(), ClientRegionMaps())
    got = views.tensor(m.TensorRef("IN", datatype, list(array.shape), arena.name, start, array.nbytes))
    assert got.dtype == array.dtype and got.shape == array.shape
    assert got.tobytes() == array.tobytes()
    arena.array[start : start + array.nbytes] = 0  # a view, not a copy
    assert not got.any()


def test_bytes_inputs_are_deserialized(arena: Arena) -> None:
    wire = serialize_bytes(np.array([b"ab", b""], dtype=np.object_))
    start = put(arena, wire)
    got = TensorViews(RegionCache(), ClientRegionMaps()).tensor(
        m.TensorRef("IN", "BYTES", [2], arena.name, start, len(wire)))
    assert got.tolist() == [b"ab", b""]


def test_a_range_outside_the_segment_is_an_internal_error_naming_no_segment(arena: Arena) -> None:
    views = TensorViews(RegionCache(), ClientRegionMaps())
    for offset in (-4, (1 << 16) - 4):
        with pytest.raises(ConveyorError) as caught:
            views.tensor(m.TensorRef("IN", "INT32", [2], arena.name, offset, 8))
        assert caught.value.status == Status.INTERNAL
        assert caught.value.message == (f"a tensor's range [{offset}, {offset + 8}) lies outside the server's "
                                        f"shared-memory segment of {1 << 16} bytes")
        assert arena.name not in caught.value.message


def test_bytes_that_do_not_hold_the_shape_are_refused(arena: Arena) -> None:
    views = TensorViews(RegionCache(), ClientRegionMaps())
    with pytest.raises(ConveyorError) as caught:
        views.tensor(m.TensorRef("IN", "INT32", [1, 3], arena.name, 0, 8))
    assert caught.value.status == Status.INVALID_ARG
    assert caught.value.message == "input 'IN': 8 bytes do not hold shape [1, 3] of INT32"
