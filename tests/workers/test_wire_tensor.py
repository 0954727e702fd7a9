"""Outputs a backend hands over already in wire form (``WireTensor``, vLLM's per-token outputs) reach
shared memory byte for byte as the same outputs given as numpy arrays would, and read back the same."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from conveyor.proto import messages as m
from conveyor.proto.datatypes import pack_bytes, serialize_bytes, split_bytes
from conveyor.proto.errors import ConveyorError
from conveyor.shm.arena import Arena
from conveyor.workers.backends.base import RequestOutcome, WireTensor
from conveyor.workers.batch_io import IoPlan, OutputWriter, plan_request_outputs

LEVEL = "unit"

PLAN = IoPlan(batched=False, reshape={}, out_datatype={}, out_reshape={}, outputs_sorted=(), labels={})


@pytest.fixture
def arena() -> Iterator[Arena]:
    a = Arena(f"/conveyor.test.wire.{os.getpid()}", 1 << 20)
    yield a
    a.close()


Written = list[tuple[str, str, list[int], bytes]]


def _written(arena: Arena, outcome: RequestOutcome, specs: list[m.OutputSpec]) -> Written:
    item = m.BatchItem(1, [], specs)
    (result,) = OutputWriter(arena, None).write(plan_request_outputs([item], [outcome], PLAN))  # type: ignore[arg-type]
    assert result.error is None
    return [(r.name, r.datatype, r.shape, bytes(arena.view(r.offset, r.nbytes))) for r in result.outputs]


def test_wire_outputs_land_as_the_same_arrays_would(arena: Arena) -> None:
    texts = ["héllo", "", "a longer piece of text"]
    specs = [m.OutputSpec("text_output"), m.OutputSpec("num_output_tokens")]
    wire = {
        "text_output": WireTensor("BYTES", [3], pack_bytes([t.encode() for t in texts])),
        "num_output_tokens": WireTensor("UINT32", [3], np.array([1, 0, 7], "<u4").tobytes()),
    }
    arrays = {
        "text_output": np.array([t.encode() for t in texts], dtype=object),
        "num_output_tokens": np.array([1, 0, 7], dtype=np.uint32),
    }
    assert _written(arena, wire, specs) == _written(arena, arrays, specs)
    name, datatype, shape, data = _written(arena, wire, specs)[0]
    assert (name, datatype, shape) == ("text_output", "BYTES", [3])
    assert [b.decode() for b in split_bytes(data, 3)] == texts


def test_only_the_requested_wire_outputs_are_written(arena: Arena) -> None:
    wire = {
        "text_output": WireTensor("BYTES", [1], pack_bytes([b"x"])),
        "finish_reason": WireTensor("BYTES", [1], pack_bytes([b"None"])),
    }
    assert [o[0] for o in _written(arena, wire, [m.OutputSpec("finish_reason")])] == ["finish_reason"]


def test_classification_of_a_wire_output_reads_it_as_an_array(arena: Arena) -> None:
    scores = np.array([0.1, 0.7, 0.2], dtype=np.float32)
    wire = {"scores": WireTensor("FP32", [3], scores.tobytes())}
    (out,) = _written(arena, wire, [m.OutputSpec("scores", classification=2)])
    assert out[1] == "BYTES"
    assert split_bytes(out[3], 2) == [b"0.700000:1", b"0.200000:2"]


def test_wire_tensor_to_numpy_round_trips() -> None:
    values = np.array([[b"a", b"bc"]], dtype=object)
    assert WireTensor("BYTES", [1, 2], serialize_bytes(values)).to_numpy().tolist() == values.tolist()
    counts = np.array([3, 4], dtype=np.uint32)
    assert WireTensor("UINT32", [2], counts.tobytes()).to_numpy().tolist() == [3, 4]


@pytest.mark.parametrize("data", [b"\x05\x00\x00\x00ab", b"\x01\x00\x00\x00ab", b"\x01\x00"])
def test_split_bytes_refuses_data_that_does_not_hold_its_elements(data: bytes) -> None:
    with pytest.raises(ConveyorError):
        split_bytes(data, 1)
