"""A small Triton model repository made on the fly from tiny ONNX graphs.

``conveyor serve`` with no ``--model-repository`` serves this; the tests build
their models with the same helpers. Nothing is downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import onnx
from onnx import TensorProto, helper

OPSET = 13
IR_VERSION = 8  # readable by every onnxruntime this project supports


def _write_file(path: str, content: str | bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if isinstance(content, bytes):
        with open(path, "wb") as f:
            f.write(content)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)


def write_model(repo: str | os.PathLike[str], name: str, config: str | None,
                files: Mapping[str, str | bytes] | None = None, *, versions: Iterable[int] = (1,),
                model_files: Mapping[str, str | bytes] | None = None) -> str:
    """One model of a Triton model repository: ``<repo>/<name>/config.pbtxt`` holding ``config``
    (none where it is None), a folder ``<repo>/<name>/<version>/`` for each of ``versions`` (made
    even when ``files`` is empty) holding ``files`` (relative path -> text or bytes), and
    ``model_files`` (such as labels) beside the config. Returns the model's directory."""
    model_dir = os.path.join(os.fspath(repo), name)
    os.makedirs(model_dir, exist_ok=True)
    for version in versions:
        vdir = os.path.join(model_dir, str(version))
        os.makedirs(vdir, exist_ok=True)
        for rel, content in (files or {}).items():
            _write_file(os.path.join(vdir, rel), content)
    for rel, content in (model_files or {}).items():
        _write_file(os.path.join(model_dir, rel), content)
    if config is not None:
        _write_file(os.path.join(model_dir, "config.pbtxt"), config)
    return model_dir


def save_onnx(model: onnx.ModelProto, repo: str | os.PathLike[str], name: str, config: str | None,
              version: int = 1) -> str:
    """``model`` (checked, at this project's IR version) as ``<repo>/<name>/<version>/model.onnx``,
    with ``config`` as its config.pbtxt. Returns the path of model.onnx."""
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    model_dir = write_model(repo, name, config, {"model.onnx": model.SerializeToString()}, versions=(version,))
    return os.path.join(model_dir, str(version), "model.onnx")


def _graph(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], name: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def add_sub(repo: str, name: str = "simple", max_batch_size: int = 8, dynamic_batching: str = "") -> None:
    """Triton's classic 'simple' model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, INT32 [16]."""
    batch = ["B"] if max_batch_size > 0 else []
    vi = helper.make_tensor_value_info
    model = _graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        [vi("INPUT0", TensorProto.INT32, [*batch, 16]), vi("INPUT1", TensorProto.INT32, [*batch, 16])],
        [vi("OUTPUT0", TensorProto.INT32, [*batch, 16]), vi("OUTPUT1", TensorProto.INT32, [*batch, 16])],
        name,
    )
    config = f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [
  {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
{dynamic_batching}
"""
    save_onnx(model, repo, name, config)


def identity(repo: str, name: str, datatype: str = "FP32", max_batch_size: int = 0,
             dims: str = "-1", dynamic_batching: str = "", extra: str = "") -> None:
    """OUTPUT0 = INPUT0 for any shape along ``dims`` (a BYTES identity is a string model)."""
    onnx_type = {"FP32": TensorProto.FLOAT, "BYTES": TensorProto.STRING, "FP16": TensorProto.FLOAT16,
                 "INT64": TensorProto.INT64, "BOOL": TensorProto.BOOL, "UINT8": TensorProto.UINT8,
                 "FP64": TensorProto.DOUBLE, "INT8": TensorProto.INT8}[datatype]
    config_type = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    dim_list = [int(d) for d in dims.split(",")]
    shape: list[int | str] = [d if d >= 0 else f"d{i}" for i, d in enumerate(dim_list)]
    if max_batch_size > 0:
        shape = ["B", *shape]
    vi = helper.make_tensor_value_info
    model = _graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                   [vi("INPUT0", onnx_type, shape)], [vi("OUTPUT0", onnx_type, shape)], name)
    config = f"""name: "{name}"
backend: "onnxruntime"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: {config_type} dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT0" data_type: {config_type} dims: [ {dims} ] {extra} }} ]
{dynamic_batching}
"""
    save_onnx(model, repo, name, config)


def build(repo: str) -> str:
    """The example repository: add/sub (batched, dynamic batching), FP32 and string identities."""
    os.makedirs(repo, exist_ok=True)
    add_sub(repo, "simple", 8, "dynamic_batching { }")
    identity(repo, "identity_fp32", "FP32", 0, "-1")
    identity(repo, "simple_string", "BYTES", 8, "16", "dynamic_batching { }")
    return repo
