"""ONNX models whose weights live in external-data files, as models over 2 GB must:
``Y = X * W + B`` with ``W`` and ``B`` saved outside the graph (tiny here:
``size_threshold=0`` moves every initializer out)."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conveyor.deploy.example_repo import IR_VERSION, OPSET, write_model

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
    folder = os.path.join(write_model(repo, name, config), "1", "model.onnx")
    save_external(os.path.join(folder, "model.onnx"))
    return folder


def model_file_beside_data(repo: str, name: str, config: str) -> str:
    """``<name>/1/model.onnx`` a file, its external data ``<name>/1/weights.bin`` beside it."""
    path = os.path.join(write_model(repo, name, config), "1", "model.onnx")
    save_external(path)
    return path


CONFIG = """max_batch_size: 8
input [{ name: "X" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "Y" data_type: TYPE_FP32 dims: [4] }]
"""


EMBEDDING_DATA = "embedding.bin"


def big_embedding(repo: str, name: str, mib: int, external: bool = True) -> str:
    """``Y = W[I]``: an embedding table of ``mib`` MiB of FP32 rows of 4 (each row [1, 1, 1, 1]),
    in an external-data file beside ``<name>/1/model.onnx`` (or, not ``external``, inside the
    graph: under 2 GiB only), and no config.pbtxt: the router completes the config from the
    graph. Returns the path of the biggest file written."""
    rows = mib * (1 << 20) // 16
    folder = os.path.join(repo, name, "1")
    os.makedirs(folder, exist_ok=True)
    if external:
        table = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[rows, 4])
        table.data_location = TensorProto.EXTERNAL
        for key, value in (("location", EMBEDDING_DATA), ("offset", "0"), ("length", str(rows * 16))):
            entry = table.external_data.add()
            entry.key, entry.value = key, value
    else:
        table = numpy_helper.from_array(np.ones((rows, 4), dtype=np.float32), "W")
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([helper.make_node("Gather", ["W", "I"], ["Y"])], name,
                              [vi("I", TensorProto.INT64, ["batch", 1])], [vi("Y", TensorProto.FLOAT, ["batch", 1, 4])],
                              initializer=[table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    path = os.path.join(folder, "model.onnx")
    onnx.save_model(model, path)
    if not external:
        return path
    data = os.path.join(folder, EMBEDDING_DATA)
    chunk = np.ones((1 << 20) // 4, dtype=np.float32)  # 1 MiB
    with open(data, "wb") as f:
        for _ in range(mib):
            chunk.tofile(f)
    return data
