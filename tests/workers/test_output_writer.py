"""The worker's output writer: outputs that all go into clients' shared-memory regions take no
block of the worker's arena (nothing for the ingress to release, nothing for the worker to reclaim);
outputs returned as bytes take one block per batch, with a release flag per request."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from conveyor.proto import messages as m
from conveyor.shm.arena import Arena
from conveyor.workers.batch_io import IoPlan, OutputWriter, plan_request_outputs

LEVEL = "unit"

PLAN = IoPlan(batched=False, reshape={}, out_datatype={}, out_reshape={}, outputs_sorted=(), labels={})


class ClientRegion:
    """The one client region these tests write into (``TensorViews.raw`` for it)."""

    def __init__(self, nbytes: int) -> None:
        self.data = np.zeros(nbytes, np.uint8)

    def raw(self, region: str, offset: int, nbytes: int, *, writable: bool = False) -> Any:
        return self.data[offset : offset + nbytes]


@pytest.fixture
def arena() -> Iterator[Arena]:
    a = Arena(f"/conveyor.test.writer.{os.getpid()}", 1 << 20)
    yield a
    a.close()


def test_outputs_all_in_client_regions_take_no_block(arena: Arena) -> None:
    region = ClientRegion(64)
    items = [m.BatchItem(i, [], [m.OutputSpec("OUT", 0, "client:r", 16 * i, 16)]) for i in range(2)]
    outcomes = [{"OUT": np.full(4, i + 1, np.int32)} for i in range(2)]
    results = OutputWriter(arena, region).write(plan_request_outputs(items, outcomes, PLAN))  # type: ignore[arg-type]
    assert [r.release for r in results] == [[], []]
    assert [(o.region, o.offset, o.nbytes) for r in results for o in r.outputs] == [("client:r", 0, 16),
                                                                                    ("client:r", 16, 16)]
    assert region.data[:32].view(np.int32).tolist() == [1] * 4 + [2] * 4
    assert arena.outstanding == 0


def test_a_region_too_small_fails_its_request_alone(arena: Arena) -> None:
    region = ClientRegion(64)
    items = [m.BatchItem(0, [], [m.OutputSpec("OUT", 0, "client:r", 0, 8)]),
             m.BatchItem(1, [], [m.OutputSpec("OUT", 0, "client:r", 16, 16)])]
    outcomes = [{"OUT": np.ones(4, np.int32)}, {"OUT": np.ones(4, np.int32)}]
    first, second = OutputWriter(arena, region).write(plan_request_outputs(items, outcomes, PLAN))  # type: ignore[arg-type]
    assert first.error is not None and "should be at least 16 bytes" in first.error.message
    assert second.error is None and second.release == []
    assert arena.outstanding == 0


def test_outputs_returned_as_bytes_take_one_block_with_a_flag_per_request(arena: Arena) -> None:
    region = ClientRegion(64)
    items = [m.BatchItem(0, [], [m.OutputSpec("OUT", 0, "client:r", 0, 16)]),
             m.BatchItem(1, [], [m.OutputSpec("OUT")])]
    outcomes = [{"OUT": np.ones(4, np.int32)}, {"OUT": np.arange(4, dtype=np.int32)}]
    first, second = OutputWriter(arena, region).write(plan_request_outputs(items, outcomes, PLAN))  # type: ignore[arg-type]
    assert len(first.release) == 1 and len(second.release) == 1
    (out,) = second.outputs
    assert out.region == arena.name
    assert arena.view(out.offset, out.nbytes).view(np.int32).tolist() == [0, 1, 2, 3]
    assert arena.outstanding == 1


# Every fixed-size datatype a model may return, in the shapes and layouts that take different copies:
# scalars, empty tensors, strided views (a transposed or sliced array), big-endian arrays.
NUMBER_OUTPUTS: list[tuple[np.ndarray, str]] = [
    (np.array([True, False, True]), "BOOL"),
    (np.arange(6, dtype=np.uint8).reshape(2, 3), "UINT8"),
    (np.arange(4, dtype=np.uint16), "UINT16"),
    (np.arange(4, dtype=np.uint32), "UINT32"),
    (np.arange(4, dtype=np.uint64), "UINT64"),
    (np.arange(-2, 2, dtype=np.int8), "INT8"),
    (np.arange(-2, 2, dtype=np.int16), "INT16"),
    (np.arange(12, dtype=np.int32).reshape(3, 4).T, "INT32"),  # strided
    (np.arange(10, dtype=np.int64)[::3], "INT64"),  # strided
    (np.array([0.5, -1.5], np.float16), "FP16"),
    (np.float32(2.5) * np.ones((), np.float32), "FP32"),  # a 0-d array
    (np.zeros((0, 4), np.float64), "FP64"),  # empty
    (np.arange(4, dtype=">i4"), "INT32"),  # big-endian: written little-endian
    (np.arange(3, dtype=">f8"), "FP64"),
]


def test_every_number_output_is_written_little_endian_in_c_order_with_its_datatype(arena: Arena) -> None:
    items = [m.BatchItem(i, [], [m.OutputSpec("OUT")]) for i in range(len(NUMBER_OUTPUTS))]
    outcomes = [{"OUT": array} for array, _ in NUMBER_OUTPUTS]
    results = OutputWriter(arena, ClientRegion(0)).write(plan_request_outputs(items, outcomes, PLAN))  # type: ignore[arg-type]
    for (array, datatype), result in zip(NUMBER_OUTPUTS, results, strict=True):
        (out,) = result.outputs
        want = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<")))
        assert (out.datatype, out.shape, out.nbytes) == (datatype, list(array.shape), want.nbytes)
        assert arena.view(out.offset, out.nbytes).tobytes() == want.tobytes()
    assert arena.outstanding == 1  # one block for the batch


def test_outputs_of_no_bytes_still_take_a_block_and_a_flag(arena: Arena) -> None:
    items = [m.BatchItem(0, [], [m.OutputSpec("OUT")])]
    writer = OutputWriter(arena, ClientRegion(0))  # type: ignore[arg-type]
    (result,) = writer.write(plan_request_outputs(items, [{"OUT": np.zeros(0, np.int32)}], PLAN))
    assert result.outputs[0].nbytes == 0 and len(result.release) == 1
    assert arena.outstanding == 1
