"""Models for the adaptive-batching benchmark, made with onnx.helper (nothing downloaded).

``matmul_stack``: ``LAYERS`` dense layers of ``WIDTH`` x ``WIDTH`` (MatMul +
Relu). One row reads every weight once, so a batch of ``b`` rows costs far less
than ``b`` single rows: batching pays, as it does for real models.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conveyor.deploy.example_repo import IR_VERSION, OPSET

WIDTH = 1024
LAYERS = 4


def matmul_stack(repo: str, name: str, max_batch_size: int, extra_config: str) -> None:
    rng = np.random.default_rng(0)
    nodes, weights = [], []
    x = "INPUT0"
    for i in range(LAYERS):
        w = numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) / WIDTH**0.5).astype(np.float32), f"w{i}")
        weights.append(w)
        last = i == LAYERS - 1
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Relu", [f"m{i}"], ["OUTPUT0" if last else f"r{i}"]))
        x = f"r{i}"
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, name, [vi("INPUT0", TensorProto.FLOAT, ["B", WIDTH])],
                              [vi("OUTPUT0", TensorProto.FLOAT, ["B", WIDTH])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    onnx.save(model, os.path.join(repo, name, "1", "model.onnx"))
    with open(os.path.join(repo, name, "config.pbtxt"), "w", encoding="utf-8") as f:
        f.write(f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
{extra_config}
""")
