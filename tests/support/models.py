"""The models the tests serve, made with onnx.helper and torch.jit (nothing downloaded)."""

from __future__ import annotations

import os

from onnx import TensorProto, helper

from conveyor.deploy.example_repo import OPSET, add_sub, identity, save_onnx, write_model
from tests.support import python_bls_models, python_models, sequence_models, warmup_models

LABELS = [f"label_{i}" for i in range(10)]


def build_test_repository(repo: str, torch: bool = True) -> None:
    """Every kind of model the e2e tests serve; without ``torch`` no TorchScript model (a group that serves
    none starts without importing torch in its workers: seconds of each one's start-up)."""
    add_sub(repo, "simple", 8, "dynamic_batching { max_queue_delay_microseconds: 2000 }")
    add_sub(repo, "simple_nobatch", 0)
    identity(repo, "identity_fp32", "FP32", 0, "-1")
    identity(repo, "identity_fp16", "FP16", 0, "-1")
    identity(repo, "identity_bool", "BOOL", 0, "-1")
    identity(repo, "identity_int64_batched", "INT64", 16, "-1", "dynamic_batching { }")
    identity(repo, "simple_string", "BYTES", 8, "16", "dynamic_batching { }")
    identity(repo, "classifier", "FP32", 4, "10", "", 'label_filename: "labels.txt"')
    write_model(repo, "classifier", None, model_files={"labels.txt": "\n".join(LABELS) + "\n"})
    add_sub(repo, "no_config", 8)
    os.remove(os.path.join(repo, "no_config", "config.pbtxt"))  # completed from the ONNX graph
    add_sub(repo, "simple_two_instances", 8, "instance_group [{ count: 2 kind: KIND_CPU }]")
    # Broken models: the server must keep serving the others and say why.
    add_sub(repo, "gpu_only", 8, "instance_group [{ count: 1 kind: KIND_GPU }]")
    write_model(repo, "bad_config", 'name: "bad_config"\nplatform: "onnxruntime_onnx"\nmax_batch_size: [oops\n')
    add_sub(repo, "missing_file", 0)
    os.remove(os.path.join(repo, "missing_file", "1", "model.onnx"))
    python_models.build(repo)
    python_bls_models.build(repo)
    # A TensorRT engine needs TensorRT and a GPU: where either is missing it must say so and not hold others back.
    write_model(repo, "trt_plan", 'platform: "tensorrt_plan"\nmax_batch_size: 0\n'
                'input [{ name: "x" data_type: TYPE_FP32 dims: [4] }]\n'
                'output [{ name: "y" data_type: TYPE_FP32 dims: [4] }]\n', {"model.plan": b"not an engine"})
    build_scheduling_models(repo)
    sequence_models.build(repo)
    warmup_models.build(repo)
    if not torch:
        return
    try:
        from tests.support import torch_models
    except ImportError:  # torch is an optional extra: its tests skip without it
        return
    torch_models.build(repo)


# Batches of these leave only at 4 rows (or after 30 s): the tests decide when.
_GATED = "preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000"


def build_scheduling_models(repo: str) -> None:
    """Single-instance models whose queues the scheduling tests fill on purpose."""
    position(repo, "sched_priority", f"{_GATED} priority_levels: 2 default_priority_level: 2")
    position(repo, "sched_queue_full", f"""{_GATED} priority_levels: 2 default_priority_level: 2
        priority_queue_policy {{ key: 2 value: {{ max_queue_size: 1 }} }}""")
    position(repo, "sched_reject", f"""{_GATED} default_queue_policy {{
        timeout_action: REJECT default_timeout_microseconds: 60000000 allow_timeout_override: true }}""")
    position(repo, "sched_delay", f"""{_GATED} default_queue_policy {{
        timeout_action: DELAY default_timeout_microseconds: 60000000 allow_timeout_override: true }}""")
    squares(repo, "sched_ordered", f"{_GATED} preserve_ordering: true", instances=2)


def _config(name: str, input_type: str, in_dims: str, out_dims: str, dynamic_batching: str, instances: int) -> str:
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: {input_type} dims: [ {in_dims} ] }} ]
output [ {{ name: "OUTPUT0" data_type: {input_type} dims: [ {out_dims} ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
dynamic_batching {{ {dynamic_batching} }}
"""


def position(repo: str, name: str, dynamic_batching: str) -> None:
    """OUTPUT0 = running sum of INPUT0 down the batch: send ones and each row
    reads its 1-based place in the batch it ran in."""
    vi = helper.make_tensor_value_info
    axis = helper.make_tensor("axis", TensorProto.INT64, [], [0])
    graph = helper.make_graph(
        [helper.make_node("CumSum", ["INPUT0", "axis"], ["OUTPUT0"])], name,
        [vi("INPUT0", TensorProto.INT32, ["B", 1])], [vi("OUTPUT0", TensorProto.INT32, ["B", 1])], [axis],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    save_onnx(model, repo, name, _config(name, "TYPE_INT32", "1", "1", dynamic_batching, 1))


def squares(repo: str, name: str, dynamic_batching: str, instances: int) -> None:
    """OUTPUT0 = sum of INPUT0 @ INPUT0 per request: an [n, n] input costs n^3,
    so a big one keeps an instance busy while a small one finishes."""
    vi = helper.make_tensor_value_info
    axes = helper.make_tensor("axes", TensorProto.INT64, [2], [1, 2])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["INPUT0", "INPUT0"], ["square"]),
         helper.make_node("ReduceSum", ["square", "axes"], ["OUTPUT0"], keepdims=1)], name,
        [vi("INPUT0", TensorProto.FLOAT, ["B", "n", "n"])], [vi("OUTPUT0", TensorProto.FLOAT, ["B", 1, 1])], [axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    save_onnx(model, repo, name, _config(name, "TYPE_FP32", "-1, -1", "1, 1", dynamic_batching, instances))
