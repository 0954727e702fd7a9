"""ONNX models whose weights live in external-data files, as models over 2 GB must:
``Y = X * W + B`` with ``W`` and ``B`` saved outside the graph (tiny here:
``size_threshold=0`` moves every initializer out)."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conveyor.deploy.example_repo import IR_VERSION, OPSET

W = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
B = np.array([0.5, -0.5, 10.0, -10.0], dtype=np.float32)
WEIGHTS = "weights.bin"


def expected(x: np.ndarray) -> np.ndarray:
    return np.asarray(x * W + B, dtype=np.float32)


def scale_shift() -> onnx.ModelProto:
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "W"], ["XW"]), helper.make_node("Add", ["XW", "B"], ["Y"])],
        "scale_shift",
        [vi("X", TensorProto.FLOAT, ["batch", 4])],
        [vi("Y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def save_external(path: str) -> None:
    """``path`` (an .onnx file) with its weights in ``weights.bin`` beside it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save_model(scale_shift(), path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=WEIGHTS, size_threshold=0)
    assert os.path.getsize(os.path.join(os.path.dirname(path), WEIGHTS)) == W.nbytes + B.nbytes


def model_directory(repo: str, name: str, config: str | None = None) -> str:
    """Triton's layout for big models: ``<name>/1/model.onnx/`` is a directory holding
    ``model.onnx`` and its external data. No config.pbtxt unless ``config`` is given."""
    save_external(os.path.join(repo, name, "1", "model.onnx", "model.onnx"))
    if config is not None:
        with open(os.path.join(repo, name, "config.pbtxt"), "w", encoding="utf-8") as f:
            f.write(config)
    return os.path.join(repo, name, "1", "model.onnx")


def model_file_beside_data(repo: str, name: str, config: str) -> str:
    """``<name>/1/model.onnx`` a file, its external data ``<name>/1/weights.bin`` beside it."""
    path = os.path.join(repo, name, "1", "model.onnx")
    save_external(path)
    with open(os.path.join(repo, name, "config.pbtxt"), "w", encoding="utf-8") as f:
        f.write(config)
    return path


CONFIG = """max_batch_size: 8
input [{ name: "X" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "Y" data_type: TYPE_FP32 dims: [4] }]
"""
