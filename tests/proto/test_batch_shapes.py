"""Ragged and padded batching, without a server: which configs load (and why
not), the batch inputs Triton defines, how a batch is built and split back,
and which requests the router lets share a batch."""

from __future__ import annotations

import numpy as np
import pytest

from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.batch_shapes import BatchShapes
from conveyor.proto.errors import ConveyorError
from conveyor.proto.model_config import parse_text
from conveyor.router.pending import Pending
from conveyor.router.repository.onnx_autocomplete import complete_onnx
from conveyor.router.scheduling.batcher import DynamicBatcher
from conveyor.router.scheduling.shape_keys import batch_key
from conveyor.router.spec.validate import validate
from conveyor.workers.batch_layout import BatchLayout, batch_input_tensor
from tests.support.ragged_models import ragged_sum

LEVEL = "unit"

K = mc.BatchInput.Kind

RAGGED = """
name: "m" backend: "onnxruntime" max_batch_size: 8
input [{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true },
       { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }]
dynamic_batching { }
"""

PADDED = """
name: "m" backend: "onnxruntime" max_batch_size: 8
input [{ name: "X" data_type: TYPE_FP32 dims: [ -1, 3, -1 ] }, { name: "T" data_type: TYPE_INT32 dims: [ -1 ] }]
output [{ name: "SAME" data_type: TYPE_FP32 dims: [ -1, 3, -1 ] },
        { name: "FIRST" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "FIXED" data_type: TYPE_FP32 dims: [ 4 ] }]
dynamic_batching { }
"""


def config(text: str, extra: str = "") -> mc.ModelConfig:
    return parse_text(text + extra)


def pad(policy: str, more: str = "") -> str:
    return f'parameters {{ key: "conveyor.pad_batching" value {{ string_value: "{policy}" }} }}\n{more}'


def param(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


def batch_input(kind: str, dtype: str = "TYPE_INT32", source: str = '"X"', target: str = '"IDX"') -> str:
    return f"batch_input [{{ kind: {kind} target_name: [{target}] data_type: {dtype} source_input: [{source}] }}]\n"


# --- which configs load -----------------------------------------------------------------


def test_ragged_and_batch_io_configs_load() -> None:
    cfg = config(RAGGED, batch_input("BATCH_ACCUMULATED_ELEMENT_COUNT") + batch_input(
        "BATCH_ITEM_SHAPE", "TYPE_FP32", target='"SHAPES", "SHAPES2"') +
        'batch_output [{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUT" source_input: "X" }]')
    assert validate(cfg) == ""
    shapes = BatchShapes.from_config(cfg)
    assert shapes.ragged == {"X"} and shapes.scatter["OUT"].shape == (-1, -1)
    assert [b.targets for b in shapes.batch_inputs] == [("IDX",), ("SHAPES", "SHAPES2")]


@pytest.mark.parametrize(("extra", "reason"), [
    (batch_input("BATCH_ELEMENT_COUNT", source='"X", "Y"'),
     "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 2"),
    (batch_input("BATCH_ELEMENT_COUNT", "TYPE_INT64"), "batch input data type must be TYPE_INT32 or TYPE_FP32"),
    (batch_input("BATCH_ELEMENT_COUNT", source='"Z"'), "unknown source input name 'Z'"),
    (batch_input("BATCH_ELEMENT_COUNT", target='"Y"'), "batch input target 'Y' is also a declared input"),
    (batch_input("BATCH_ELEMENT_COUNT") + batch_input("BATCH_ITEM_SHAPE"), "'IDX' is given more than once"),
    ("batch_input [{ kind: BATCH_ELEMENT_COUNT data_type: TYPE_INT32 source_input: \"X\" }]", "has no target_name"),
    ('batch_output [{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "NOPE" source_input: "X" }]',
     "unknown target output name 'NOPE'"),
    ('batch_output [{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUT" source_input: ["X", "Y"] }]',
     "expects 1 source input, got 2"),
    ('batch_output [{ target_name: "OUT" source_input: "X" }, { target_name: "OUT" source_input: "X" }]',
     "target output name 'OUT' can only be specified once"),
])
def test_bad_batch_io_is_refused_with_tritons_reason(extra: str, reason: str) -> None:
    assert reason in validate(config(RAGGED, extra))


def test_python_models_refuse_batch_inputs_but_may_pad() -> None:
    text = RAGGED.replace('backend: "onnxruntime"', 'backend: "python"')
    assert "not supported by the python backend" in validate(config(text, batch_input("BATCH_ELEMENT_COUNT")))
    assert validate(config(PADDED.replace('backend: "onnxruntime"', 'backend: "python"'), pad("max"))) == ""


def test_pad_policy_configs() -> None:
    assert validate(config(PADDED, pad("max"))) == ""
    shapes = BatchShapes.from_config(config(PADDED, pad("8,16") + param("conveyor.pad_value.T", "-1")))
    assert shapes.buckets == (8, 16) and shapes.padded["X"].positions == (0, 2)
    assert shapes.padded["X"].value == 0.0 and shapes.padded["T"].value == -1
    # SAME is -1 wherever X is; FIRST only where T is; FIXED follows nothing.
    assert shapes.follows == {"SAME": "X", "FIRST": "T"}
    explicit = param("conveyor.pad_output.SAME", "") + param("conveyor.pad_output.FIRST", "X")
    assert "cannot follow input 'X'" in validate(config(PADDED, pad("max", explicit)))
    assert BatchShapes.from_config(config(PADDED, pad("max", param("conveyor.pad_output.SAME", "")))).follows == {
        "FIRST": "T"}


@pytest.mark.parametrize(("extra", "reason"), [
    (pad("8,4"), "ascending positive bucket sizes"),
    (pad("max,8"), "ascending positive bucket sizes"),
    (pad("0,8"), "ascending positive bucket sizes"),
    (pad("max", param("conveyor.pad_value", "x")), "pad value 'x' does not fit input 'X' of type FP32"),
    (pad("max", param("conveyor.pad_value.T", "1.5")), "pad value '1.5' does not fit input 'T' of type INT32"),
    (pad("max", param("conveyor.pad_value.FIXED", "1")), "'conveyor.pad_value.FIXED' names no padded input"),
    (pad("max", param("conveyor.pad_output.NOPE", "X")), "'conveyor.pad_output.NOPE' names no declared output"),
    (pad("max", param("conveyor.pad_output.SAME", "Y")), "names 'Y', which is not a padded input"),
    (param("conveyor.pad_value", "1"), "need 'conveyor.pad_batching'"),
])
def test_bad_pad_settings_are_refused_with_a_reason(extra: str, reason: str) -> None:
    assert reason in validate(config(PADDED, extra))


def test_pad_batching_needs_dynamic_batching_and_a_variable_dim() -> None:
    assert "needs dynamic_batching" in validate(config(PADDED.replace("dynamic_batching { }", ""), pad("max")))
    fixed = RAGGED.replace("dims: [ -1 ] allow_ragged_batch: true", "dims: [ 3 ]")
    assert "no input has a variable (-1) dimension" in validate(config(fixed, pad("max")))


def test_onnx_autocompletion_leaves_batch_inputs_out(tmp_path: object) -> None:
    path = ragged_sum(str(tmp_path), "r", "")
    cfg = parse_text('name: "r" max_batch_size: 8 batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: '
                     '["COUNTS", "OFFSETS", "MAXSHAPE"] data_type: TYPE_INT32 source_input: "INPUT" }]')
    assert complete_onnx(cfg, path, True) == ""
    assert [i.name for i in cfg.input] == ["INPUT"]


# --- batch inputs -------------------------------------------------------------------------


def test_batch_inputs_have_tritons_shapes_and_values() -> None:
    shapes = [[1, 3], [1, 4], [2, 5]]  # requests: 3, 4 and 10 elements; the last has 2 rows
    assert batch_input_tensor(K.BATCH_ELEMENT_COUNT, shapes, "INT32").tolist() == [3, 4, 10]  # type: ignore[arg-type]
    acc = batch_input_tensor(K.BATCH_ACCUMULATED_ELEMENT_COUNT, shapes, "FP32")  # type: ignore[arg-type]
    assert acc.dtype == np.float32 and acc.tolist() == [3, 7, 17]
    assert batch_input_tensor(K.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, shapes, "INT32").tolist() == [0, 3, 7, 17]  # type: ignore[arg-type]
    assert batch_input_tensor(K.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE, shapes, "INT32").shape == (10,)  # type: ignore[arg-type]
    item = batch_input_tensor(K.BATCH_ITEM_SHAPE, shapes, "INT32")  # type: ignore[arg-type]
    assert item.dtype == np.int32 and item.tolist() == [[3], [4], [5], [5]]  # one per row
    assert batch_input_tensor(K.BATCH_ITEM_SHAPE_FLATTEN, [[2, 3, 1], [1, 2, 2]], "INT32").tolist() == [
        3, 1, 3, 1, 2, 2]  # Triton's documented example
    assert batch_input_tensor(K.BATCH_ITEM_SHAPE, [[2, 3, 1], [1, 2, 2]], "INT32").shape == (3, 2)


def test_ragged_batch_concatenates_elements_and_scatters_outputs_back() -> None:
    cfg = config(RAGGED, batch_input("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO") +
                 'batch_output [{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUT" source_input: "X" }]')
    layout = BatchLayout(BatchShapes.from_config(cfg))
    xs = [np.arange(3, dtype=np.float32).reshape(1, 3), np.arange(5, dtype=np.float32).reshape(1, 5)]
    ys = [np.zeros((1, 2), np.float32)] * 2
    inputs = layout.assemble({"X": xs, "Y": ys}, 2)
    assert inputs["X"].tolist() == [0, 1, 2, 0, 1, 2, 3, 4] and inputs["Y"].shape == (2, 2)
    assert inputs["IDX"].tolist() == [0, 3, 8]
    alone = layout.assemble({"X": xs[:1], "Y": ys[:1]}, 1)["X"]
    assert alone.shape == (3,) and np.shares_memory(alone, xs[0])  # one request: a view, flattened
    parts = layout.parts("OUT", inputs["X"] * 10, [{"X": [1, 3]}, {"X": [1, 5]}], [1, 1])
    assert [p.tolist() for p in parts] == [[[0, 10, 20]], [[0, 10, 20, 30, 40]]]
    with pytest.raises(ConveyorError, match="fewer than its batch_output"):
        layout.parts("OUT", np.zeros(4), [{"X": [1, 3]}, {"X": [1, 5]}], [1, 1])


def test_padding_fills_only_around_each_request_and_cuts_outputs_back() -> None:
    layout = BatchLayout(BatchShapes.from_config(config(PADDED, pad("4,8") + param("conveyor.pad_value", "-1"))))
    a = np.ones((1, 2, 3, 5), np.float32)
    b = np.full((2, 3, 3, 1), 2, np.float32)
    t = [np.array([[7]], np.int32), np.array([[8, 9], [8, 9]], np.int32)]
    inputs = layout.assemble({"X": [a, b], "T": t}, 2)
    x = inputs["X"]
    assert x.shape == (3, 4, 3, 8)  # dims 2 -> 4 and 5 -> 8 (the buckets), 3 kept
    assert (x[0, :2, :, :5] == 1).all() and (x[0, 2:] == -1).all() and (x[0, :, :, 5:] == -1).all()
    assert (x[1:, :3, :, :1] == 2).all() and (x[1:, 3:] == -1).all() and (x[1:, :, :, 1:] == -1).all()
    assert inputs["T"].tolist() == [[7, -1, -1, -1], [8, 9, -1, -1], [8, 9, -1, -1]]
    shapes = [{"X": [1, 2, 3, 5], "T": [1, 1]}, {"X": [2, 3, 3, 1], "T": [2, 2]}]
    same = layout.parts("SAME", x, shapes, [1, 2])
    assert same[0].shape == (1, 2, 3, 5) and same[1].shape == (2, 3, 3, 1) and (same[1] == 2).all()
    # An output that kept a padded dim at another length is the model's own: left as it is.
    first = layout.parts("FIRST", np.zeros((3, 6)), shapes, [1, 2])
    assert [p.shape for p in first] == [(1, 6), (2, 6)]
    first = layout.parts("FIRST", inputs["T"], shapes, [1, 2])
    assert [p.tolist() for p in first] == [[[7]], [[8, 9], [8, 9]]]


def test_bytes_inputs_are_padded_with_the_pad_text() -> None:
    text = PADDED.replace("name: \"T\" data_type: TYPE_INT32", "name: \"T\" data_type: TYPE_STRING")
    layout = BatchLayout(BatchShapes.from_config(config(text, pad("max", param("conveyor.pad_value.T", "<pad>")))))
    t = [np.array([[b"a"]], np.object_), np.array([[b"b", b"c"]], np.object_)]
    x = [np.zeros((1, 1, 3, 1), np.float32)] * 2
    assert layout.assemble({"X": x, "T": t}, 2)["T"].tolist() == [[b"a", b"<pad>"], [b"b", b"c"]]


def test_padding_a_batch_of_equal_shapes_copies_nothing_extra() -> None:
    layout = BatchLayout(BatchShapes.from_config(config(PADDED, pad("max"))))
    a = np.ones((1, 2, 3, 5), np.float32)
    x = layout.assemble({"X": [a], "T": [np.zeros((1, 4), np.int32)]}, 1)["X"]
    assert x is a


# --- batch formation in the router -----------------------------------------------------


def request(rid: int, shape: list[int], name: str = "X") -> m.InferRequest:
    return m.InferRequest(rid, "m", "", [m.TensorRef(name, "FP32", shape, "r", 0, 4 * int(np.prod(shape)))], [])


def form(cfg: mc.ModelConfig, shapes: list[list[int]]) -> list[list[int]]:
    """The batches (request ids) a batcher forms from requests of these shapes."""
    key = batch_key(cfg, "m")
    batcher = DynamicBatcher(cfg.max_batch_size, [], 0, enabled=True)
    for i, shape in enumerate(shapes):
        req = request(i, shape)
        batcher.push(Pending(b"i", req, 0, shape[0], key(req)))
    batches = []
    while len(batcher):
        batch = batcher.next_batch(0)
        assert isinstance(batch, list)
        batches.append([p.request.id for p in batch])
    return batches


def test_ragged_and_padded_inputs_batch_whatever_their_lengths() -> None:
    plain = config(PADDED)
    assert form(plain, [[1, 2, 3, 4], [1, 5, 3, 4], [1, 5, 3, 4]]) == [[0], [1, 2]]  # Triton's rule
    assert form(config(PADDED, pad("max")), [[1, 2, 3, 4], [1, 5, 3, 4], [2, 7, 3, 1]]) == [[0, 1, 2]]
    assert form(config(RAGGED), [[1, 3], [1, 9], [3, 2]]) == [[0, 1, 2]]


def test_a_request_beyond_the_largest_bucket_is_refused_on_arrival() -> None:
    key = batch_key(config(PADDED, pad("4,8")), "m")
    assert key(request(1, [1, 8, 3, 2])) == key(request(2, [3, 1, 3, 1]))
    with pytest.raises(ConveyorError, match=r"length 9 in dimension 1 .* more than the largest pad bucket 8"):
        key(request(3, [1, 9, 3, 2]))
