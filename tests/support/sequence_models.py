"""Stateful models for the sequence-batching tests, made with onnx.helper: an
accumulator with implicit state, one that uses START instead of an initial
state, and one that echoes every control input it is given."""

from __future__ import annotations

from onnx import TensorProto, helper

from conveyor.deploy.example_repo import OPSET, save_onnx, write_model

# Long enough that no test sequence idles out by accident on a slow machine.
LONG_IDLE_US = 60_000_000
SHORT_IDLE_US = 200_000


def build(repo: str) -> None:
    accumulator(repo, "seq_direct", "direct { }", instances=2)
    accumulator(repo, "seq_oldest", "oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 1000 }",
                instances=1, with_initial_state=False)
    accumulator(repo, "seq_idle", "direct { }", instances=1, max_batch_size=1, idle_us=SHORT_IDLE_US)
    accumulator(repo, "seq_single", "direct { }", instances=1, max_batch_size=1)  # one slot, a long idle timeout
    string_echo(repo, "seq_string_state")
    controls(repo, "seq_controls", "TYPE_UINT64")
    controls(repo, "seq_controls_string", "TYPE_STRING")
    python_accumulator(repo, "seq_python")


def accumulator(repo: str, name: str, strategy: str, *, instances: int, max_batch_size: int = 4,
                idle_us: int = LONG_IDLE_US, with_initial_state: bool = True) -> None:
    """OUTPUT = INPUT + STATE; the new STATE is OUTPUT (INT32 [1]). ``instances=0``:
    no instance_group, so one instance on every worker.

    With an initial state of zeros the graph is just that. Without one, the
    state of a first request is undefined (Triton's rule), so the model reads
    START (INT32 0/1) and uses OUTPUT = INPUT + STATE * (1 - START).
    """
    vi = helper.make_tensor_value_info
    inputs = [vi("INPUT", TensorProto.INT32, ["B", 1]), vi("INPUT_STATE", TensorProto.INT32, ["B", 1])]
    if with_initial_state:
        nodes = [helper.make_node("Add", ["INPUT", "INPUT_STATE"], ["OUTPUT"])]
        initializers = []
    else:
        inputs.append(vi("START", TensorProto.INT32, ["B", 1]))
        initializers = [helper.make_tensor("one", TensorProto.INT32, [], [1])]
        nodes = [
            helper.make_node("Sub", ["one", "START"], ["keep"]),
            helper.make_node("Mul", ["INPUT_STATE", "keep"], ["kept"]),
            helper.make_node("Add", ["INPUT", "kept"], ["OUTPUT"]),
        ]
    nodes.append(helper.make_node("Identity", ["OUTPUT"], ["OUTPUT_STATE"]))
    outputs = [vi("OUTPUT", TensorProto.INT32, ["B", 1]), vi("OUTPUT_STATE", TensorProto.INT32, ["B", 1])]
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    save_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), repo, name, f"""
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
{f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]" if instances else ""}
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  {_START_INT32 if not with_initial_state else ""}
  state [ {{
    input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ]
    {_ZERO_STATE if with_initial_state else ""}
  }} ]
}}
""")


def variable_accumulator(repo: str, name: str) -> None:
    """qa/L0_sequence_batcher's variable-shaped implicit-state model: INPUT and the state INT32 [-1], no initial
    state (a first request's is [1] zeros), OUTPUT = INPUT + STATE * (1 - START) (broadcast: the state takes the
    input's shape after the first request); the new STATE is OUTPUT. One instance, 4 slots, direct."""
    vi = helper.make_tensor_value_info
    inputs = [vi("INPUT", TensorProto.INT32, ["B", "N"]), vi("INPUT_STATE", TensorProto.INT32, ["B", "S"]),
              vi("START", TensorProto.INT32, ["B", 1])]
    nodes = [
        helper.make_node("Sub", ["one", "START"], ["keep"]),
        helper.make_node("Mul", ["INPUT_STATE", "keep"], ["kept"]),
        helper.make_node("Add", ["INPUT", "kept"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["OUTPUT_STATE"]),
    ]
    outputs = [vi("OUTPUT", TensorProto.INT32, ["B", "N"]), vi("OUTPUT_STATE", TensorProto.INT32, ["B", "N"])]
    graph = helper.make_graph(nodes, name, inputs, outputs, [helper.make_tensor("one", TensorProto.INT32, [], [1])])
    save_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), repo, name, f"""
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {LONG_IDLE_US}
  direct {{ }}
  {_START_INT32}
  state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ -1 ] }} ]
}}
""")


def string_echo(repo: str, name: str) -> None:
    """A TYPE_STRING state: OUTPUT = the state (the previous request's INPUT; empty strings at first), the new
    state = INPUT."""
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT_STATE"], ["OUTPUT"]), helper.make_node("Identity", ["INPUT"],
                                                                                        ["OUTPUT_STATE"])],
        name, [vi("INPUT", TensorProto.STRING, ["B", 2]), vi("INPUT_STATE", TensorProto.STRING, ["B", 2])],
        [vi("OUTPUT", TensorProto.STRING, ["B", 2]), vi("OUTPUT_STATE", TensorProto.STRING, ["B", 2])])
    save_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), repo, name, f"""
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_STRING dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_STRING dims: [ 2 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {LONG_IDLE_US}
  state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_STRING dims: [ 2 ]
            initial_state {{ data_type: TYPE_STRING dims: [ 2 ] zero_data: true name: "empty" }} }} ]
}}
""")


_START_INT32 = (
    'control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]'
)
_ZERO_STATE = 'initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" }'


def controls(repo: str, name: str, corrid_type: str) -> None:
    """Echoes what the server feeds it: OUTPUT = INPUT, OUT_START/END/READY/CORRID
    = the START (FP32 0.5/1.5), END (INT32 10/20), READY (BOOL) and CORRID inputs."""
    vi = helper.make_tensor_value_info
    onnx_corrid = TensorProto.STRING if corrid_type == "TYPE_STRING" else TensorProto.UINT64
    pairs = [
        ("INPUT", "OUTPUT", TensorProto.INT32), ("START", "OUT_START", TensorProto.FLOAT),
        ("END", "OUT_END", TensorProto.INT32), ("READY", "OUT_READY", TensorProto.BOOL),
        ("CORRID", "OUT_CORRID", onnx_corrid),
    ]
    graph = helper.make_graph(
        [helper.make_node("Identity", [i], [o]) for i, o, _ in pairs], name,
        [vi(i, t, ["B", 1]) for i, _, t in pairs], [vi(o, t, ["B", 1]) for _, o, t in pairs],
    )
    save_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), repo, name, f"""
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "OUT_START" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "OUT_END" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "OUT_READY" data_type: TYPE_BOOL dims: [ 1 ] }},
  {{ name: "OUT_CORRID" data_type: {"TYPE_STRING" if corrid_type == "TYPE_STRING" else "TYPE_UINT64"} dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {LONG_IDLE_US}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0.5, 1.5 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 10, 20 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}
  ]
}}
""")


PYTHON_ACCUMULATOR = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Keeps each sequence's running sum itself, keyed by its correlation id."""

    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.correlation_id()
            flags = request.flags()
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            total = value + (0 if start.all() else self.sums.get(key, 0))
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                self.sums.pop(key, None)
            else:
                self.sums[key] = total
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", total.astype(np.int32))]))
        return responses
'''


def python_accumulator(repo: str, name: str) -> None:
    write_model(repo, name, f"""
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {LONG_IDLE_US}
  {_START_INT32}
}}
""", {"model.py": PYTHON_ACCUMULATOR})
