"""Models for ragged and padded batching, made with onnx.helper, and a Python
model, written as a user would write them for Triton."""

from __future__ import annotations

import textwrap

import onnx
from onnx import TensorProto, helper

from conveyor.deploy.example_repo import OPSET, save_onnx, write_model

# Batches of these leave only at the preferred size (or after 30 s): the tests decide what shares a batch.
GATED = "max_queue_delay_microseconds: 30000000"


def _const(name: str, kind: int, dims: list[int], values: list[float] | list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, kind, dims, values))


def ragged_sum(repo: str, name: str, config: str) -> str:
    """A ragged model as Triton documents them: INPUT is the requests' elements one
    after another; OFFSETS (BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO) says where
    each starts and ends, COUNTS (BATCH_ELEMENT_COUNT) how many it has, MAXSHAPE
    (BATCH_MAX_ELEMENT_COUNT_AS_SHAPE) is as long as the longest.

    SUM and MEAN: each request's own; BATCH_MAX: the longest request in its batch;
    DOUBLED: INPUT * 2, scattered back by BATCH_SCATTER_WITH_INPUT_SHAPE."""
    vi = helper.make_tensor_value_info
    nodes = [
        _const("zero", TensorProto.FLOAT, [1], [0.0]),
        _const("two", TensorProto.FLOAT, [], [2.0]),
        _const("one_i", TensorProto.INT64, [1], [1]),
        _const("zero_i", TensorProto.INT64, [1], [0]),
        _const("last_i", TensorProto.INT64, [1], [-1]),
        _const("end_i", TensorProto.INT64, [1], [2**62]),
        _const("axis0", TensorProto.INT64, [], [0]),
        _const("axes1", TensorProto.INT64, [1], [1]),
        # prefix[k] = sum of the first k elements of the whole batch
        helper.make_node("Concat", ["zero", "INPUT"], ["padded"], axis=0),
        helper.make_node("CumSum", ["padded", "axis0"], ["prefix"]),
        helper.make_node("Cast", ["OFFSETS"], ["offsets"], to=TensorProto.INT64),
        helper.make_node("Slice", ["offsets", "one_i", "end_i"], ["ends"]),
        helper.make_node("Slice", ["offsets", "zero_i", "last_i"], ["starts"]),
        helper.make_node("Gather", ["prefix", "ends"], ["at_end"]),
        helper.make_node("Gather", ["prefix", "starts"], ["at_start"]),
        helper.make_node("Sub", ["at_end", "at_start"], ["sums"]),
        helper.make_node("Unsqueeze", ["sums", "axes1"], ["SUM"]),
        helper.make_node("Div", ["sums", "COUNTS"], ["means"]),
        helper.make_node("Unsqueeze", ["means", "axes1"], ["MEAN"]),
        helper.make_node("Shape", ["MAXSHAPE"], ["max_shape"]),
        helper.make_node("Cast", ["max_shape"], ["max_len"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["SUM", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "max_len"], ["BATCH_MAX"]),
        helper.make_node("Mul", ["INPUT", "two"], ["DOUBLED"]),
    ]
    graph = helper.make_graph(
        nodes, name,
        [vi("INPUT", TensorProto.FLOAT, ["N"]), vi("OFFSETS", TensorProto.INT32, ["B1"]),
         vi("COUNTS", TensorProto.FLOAT, ["B"]), vi("MAXSHAPE", TensorProto.FLOAT, ["M"])],
        [vi("SUM", TensorProto.FLOAT, ["B", 1]), vi("MEAN", TensorProto.FLOAT, ["B", 1]),
         vi("BATCH_MAX", TensorProto.FLOAT, ["B", 1]), vi("DOUBLED", TensorProto.FLOAT, ["N"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    return save_onnx(model, repo, name, config or None)


RAGGED_SUM_CONFIG = f"""
name: "ragged_sum"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [{{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }}]
batch_input [
  {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "OFFSETS" data_type: TYPE_INT32
     source_input: "INPUT" }},
  {{ kind: BATCH_ELEMENT_COUNT target_name: "COUNTS" data_type: TYPE_FP32 source_input: "INPUT" }},
  {{ kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "MAXSHAPE" data_type: TYPE_FP32 source_input: "INPUT" }}
]
output [
  {{ name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "MEAN" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "BATCH_MAX" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1 ] }}
]
batch_output [{{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "DOUBLED" source_input: "INPUT" }}]
instance_group [{{ count: 1 kind: KIND_CPU }}]
dynamic_batching {{ preferred_batch_size: [ 4 ] {GATED} }}
# Warmup batches are assembled as requests' are (the model would not load otherwise).
model_warmup [{{ name: "two" batch_size: 2 inputs {{ key: "INPUT" value {{ data_type: TYPE_FP32 dims: [ 3 ]
                 zero_data: true }} }} }}]
"""


def padded_sum(repo: str, name: str, config: str) -> None:
    """INPUT [B, W] padded to W by the server; LENGTHS (BATCH_ITEM_SHAPE, [B, 1]) holds
    each row's own length. MASKED_SUM adds a row's own elements, RAW_SUM every
    element (padding too), WIDTH is W; SCALED is INPUT * 2, cut back per request."""
    vi = helper.make_tensor_value_info
    nodes = [
        _const("zero_f", TensorProto.FLOAT, [], [0.0]),
        _const("two", TensorProto.FLOAT, [], [2.0]),
        _const("one_scalar", TensorProto.INT64, [], [1]),
        _const("zero_scalar", TensorProto.INT64, [], [0]),
        _const("axes1", TensorProto.INT64, [1], [1]),
        helper.make_node("Shape", ["INPUT"], ["shape"]),
        helper.make_node("Gather", ["shape", "one_scalar"], ["width"], axis=0),
        helper.make_node("Range", ["zero_scalar", "width", "one_scalar"], ["positions"]),
        helper.make_node("Cast", ["LENGTHS"], ["lengths"], to=TensorProto.INT64),
        helper.make_node("Less", ["positions", "lengths"], ["inside"]),  # [W] < [B, 1] -> [B, W]
        helper.make_node("Cast", ["inside"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["INPUT", "mask"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axes1"], ["MASKED_SUM"], keepdims=1),
        helper.make_node("ReduceSum", ["INPUT", "axes1"], ["RAW_SUM"], keepdims=1),
        helper.make_node("Cast", ["width"], ["width_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["RAW_SUM", "zero_f"], ["zeros"]),
        helper.make_node("Add", ["zeros", "width_f"], ["WIDTH"]),
        helper.make_node("Mul", ["INPUT", "two"], ["SCALED"]),
    ]
    graph = helper.make_graph(
        nodes, name,
        [vi("INPUT", TensorProto.FLOAT, ["B", "W"]), vi("LENGTHS", TensorProto.INT32, ["B", 1])],
        [vi("MASKED_SUM", TensorProto.FLOAT, ["B", 1]), vi("RAW_SUM", TensorProto.FLOAT, ["B", 1]),
         vi("WIDTH", TensorProto.FLOAT, ["B", 1]), vi("SCALED", TensorProto.FLOAT, ["B", "W"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    save_onnx(model, repo, name, config or None)


PADDED_SUM_CONFIG = f"""
name: "padded_sum"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [{{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] }}]
batch_input [{{ kind: BATCH_ITEM_SHAPE target_name: "LENGTHS" data_type: TYPE_INT32 source_input: "INPUT" }}]
output [
  {{ name: "MASKED_SUM" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "RAW_SUM" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "WIDTH" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "SCALED" data_type: TYPE_FP32 dims: [ -1 ] }}
]
parameters {{ key: "conveyor.pad_batching" value {{ string_value: "4,8,16" }} }}
parameters {{ key: "conveyor.pad_value" value {{ string_value: "100" }} }}
instance_group [{{ count: 1 kind: KIND_CPU }}]
dynamic_batching {{ preferred_batch_size: [ 3 ] {GATED} }}
"""

# Each request's input back as it arrived (doubled), with how many requests shared its execute call.
PYTHON_SHAPES_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            together = np.array([[len(requests)]], np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("DOUBLED", x * 2), pb_utils.Tensor("TOGETHER", together)]))
        return responses
'''


def python_config(name: str, ragged: bool) -> str:
    """Requests of any shape share a batch: by ``allow_ragged_batch`` or by ``conveyor.pad_batching``."""
    pad = "" if ragged else 'parameters { key: "conveyor.pad_batching" value { string_value: "max" } }'
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 8
input [{{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: {str(ragged).lower()} }}]
output [{{ name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1, -1 ] }},
        {{ name: "TOGETHER" data_type: TYPE_INT32 dims: [ 1 ] }}]
{pad}
instance_group [{{ count: 1 kind: KIND_CPU }}]
dynamic_batching {{ preferred_batch_size: [ 3 ] {GATED} }}
"""


# Configs the router must refuse at load, each with its reason.
BAD_CONFIGS = {
    "bad_batch_input_type": RAGGED_SUM_CONFIG.replace(
        "target_name: \"COUNTS\" data_type: TYPE_FP32", "target_name: \"COUNTS\" data_type: TYPE_INT64"),
    "bad_pad_buckets": PADDED_SUM_CONFIG.replace('"4,8,16"', '"16,8"'),
}


def build(repo: str) -> None:
    ragged_sum(repo, "ragged_sum", RAGGED_SUM_CONFIG)
    padded_sum(repo, "padded_sum", PADDED_SUM_CONFIG)
    for name, ragged in (("python_shapes", False), ("python_ragged", True)):
        write_model(repo, name, python_config(name, ragged), {"model.py": textwrap.dedent(PYTHON_SHAPES_MODEL)})
    for name, config in BAD_CONFIGS.items():
        source = "ragged_sum" if "ragged_sum" in config else "padded_sum"
        config = config.replace(f'name: "{source}"', f'name: "{name}"')
        (ragged_sum if source == "ragged_sum" else padded_sum)(repo, name, config)
