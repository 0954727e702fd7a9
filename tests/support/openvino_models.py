"""OpenVINO models for the openvino backend's tests: tiny ONNX graphs made with onnx.helper,
converted and saved as OpenVINO IR with OpenVINO's own API (``ov.convert_model``, ``ov.save_model``),
or served as ONNX files that OpenVINO reads; with Triton's README configs.

Imported only where OpenVINO is (``pip install 'conveyor[openvino]'``). ``reference`` runs a
model file with OpenVINO itself, in this process: what the served model must answer.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
import openvino as ov
from onnx import TensorProto, helper

from conveyor.deploy.example_repo import write_model

W = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5) / 7
B = np.array([0.1, -0.2, 0.3], dtype=np.float32)
CLASSES = 1001  # the README's reshaping example: any image size in, 1001 scores out
PROJECTION = np.linspace(-1, 1, 3 * CLASSES, dtype=np.float32).reshape(3, CLASSES)

# Triton's openvino_backend README, "Latency mode" and "Throughput mode", as written.
LATENCY = """parameters: [
{
   key: "NUM_STREAMS"
   value: {
     string_value: "1"
   }
},
{
   key: "PERFORMANCE_HINT"
   value: {
     string_value: "LATENCY"
   }
}
]
"""
THROUGHPUT = """instance_group [
    {
      count: 12
      kind: KIND_CPU
    }
  ]
parameters: [
{
   key: "NUM_STREAMS"
   value: {
     string_value: "12"
   }
}
]
"""
# The README's "Reshaping models" example, as written.
RESHAPING = """input [
  {
    name: "input"
    data_type: TYPE_FP32
    dims: [ -1, 3, -1, -1]
  }
]
output [
  {
    name: "output"
    data_type: TYPE_FP32
    dims: [ -1, 1001]
  }
]
parameters: {
key: "RESHAPE_IO_LAYERS"
value: {
string_value:"yes"
}
}
"""
DECLARED = """max_batch_size: 8
input [{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }]
output [{ name: "Y" data_type: TYPE_FP32 dims: [ 3 ] }]
"""


def mlp(batch: int | str = "N") -> onnx.ModelProto:
    """Y = relu(X @ W + B): X [batch, 4] -> Y [batch, 3]."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["H"]), helper.make_node("Add", ["H", "B"], ["Z"]),
         helper.make_node("Relu", ["Z"], ["Y"])],
        "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor("W", TensorProto.FLOAT, [4, 3], W.ravel()),
         helper.make_tensor("B", TensorProto.FLOAT, [3], B)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def image_scores() -> onnx.ModelProto:
    """input [1, 3, 8, 8] -> each channel's mean -> output [1, 1001]: static shapes, so serving
    other sizes needs RESHAPE_IO_LAYERS."""
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], ["flat"]), helper.make_node("MatMul", ["flat", "P"], ["output"])],
        "image_scores",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, CLASSES])],
        [helper.make_tensor("P", TensorProto.FLOAT, [3, CLASSES], PROJECTION.ravel())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _version_dir(repo: str, name: str, config: str) -> str:
    return os.path.join(write_model(repo, name, config), "1")


def save_ir(onnx_model: onnx.ModelProto, vdir: str, layout: str = "") -> str:
    """Convert with OpenVINO's own API and save IR (model.xml + model.bin) in full precision
    (``save_model`` would store the weights as FP16 by default)."""
    os.makedirs(vdir, exist_ok=True)
    source = os.path.join(vdir, "source.onnx")
    onnx.save(onnx_model, source)
    model = ov.convert_model(source)
    os.remove(source)
    if layout:  # a layout with a batch dimension tells config completion that the model batches
        for port in [*model.inputs, *model.outputs]:
            ov.layout_helpers.set_layout(port, ov.Layout(layout))
    path = os.path.join(vdir, "model.xml")
    ov.save_model(model, path, compress_to_fp16=False)
    return path


def build(repo: str) -> dict[str, str]:
    """Every OpenVINO test model in ``repo``; by name, its model file."""
    files: dict[str, str] = {}
    # IR with batch layouts and no config but its backend: completed from the model.
    files["ov_ir_auto"] = save_ir(mlp(), _version_dir(repo, "ov_ir_auto", 'backend: "openvino"\n'), layout="NC")
    # ONNX read by OpenVINO, the README's latency-mode parameters, declared I/O, dynamic batching, warmup.
    vdir = _version_dir(repo, "ov_onnx_latency", 'backend: "openvino"\ndefault_model_filename: "model.onnx"\n'
                        + DECLARED + "dynamic_batching { max_queue_delay_microseconds: 2000 }\n" + LATENCY
                        + 'model_warmup [{ name: "zeros" batch_size: 2 inputs { key: "X" value: '
                          '{ data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } }]\n')
    files["ov_onnx_latency"] = os.path.join(vdir, "model.onnx")
    onnx.save(mlp(), files["ov_onnx_latency"])
    # The README's throughput mode: 12 instances, 12 streams each.
    files["ov_throughput"] = save_ir(mlp(), _version_dir(repo, "ov_throughput", 'backend: "openvino"\n' + DECLARED
                                                         + THROUGHPUT))
    # The README's reshaping example on a model whose input is static [1, 3, 8, 8].
    files["ov_reshape"] = save_ir(image_scores(), _version_dir(repo, "ov_reshape", 'backend: "openvino"\n' + RESHAPING))
    # A static batch of 8 (SKIP_OV_DYNAMIC_BATCHSIZE): padded, or refused as Triton refuses it.
    for name, padding in (("ov_static_padded", "YES"), ("ov_static_unpadded", "NO")):
        files[name] = save_ir(mlp(batch=8), _version_dir(repo, name, 'backend: "openvino"\n' + DECLARED + f"""
parameters {{ key: "SKIP_OV_DYNAMIC_BATCHSIZE" value {{ string_value: "yes" }} }}
parameters {{ key: "ENABLE_BATCH_PADDING" value {{ string_value: "{padding}" }} }}
"""))
    # Float32 on any CPU: OpenVINO computes in bf16 by default where the CPU has bfloat16 instructions.
    files["ov_f32"] = save_ir(mlp(), _version_dir(repo, "ov_f32", 'backend: "openvino"\n' + DECLARED + """
parameters { key: "INFERENCE_PRECISION_HINT" value { string_value: "f32" } }
"""))
    # Refused at load: an input the model does not have.
    save_ir(mlp(), _version_dir(repo, "ov_wrong_input", 'backend: "openvino"\n' + DECLARED.replace('"X"', '"x"')))
    return files


def numpy_tolerance() -> tuple[float, float]:
    """How near OpenVINO's default answers are to numpy's float32 ones on this host's CPU (rtol, atol):
    bf16 (an 8-bit mantissa) where the CPU has bfloat16 instructions, as OpenVINO (and Triton's backend)
    then compute by default; float32 elsewhere."""
    if ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT") == ov.Type.f32:
        return 1e-5, 1e-6
    return 2e-2, 1e-2


def reference(path: str, inputs: dict[str, np.ndarray], shapes: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """What OpenVINO itself answers for ``inputs`` (``shapes``: reshape first, as the config asks)."""
    core = ov.Core()
    model = core.read_model(path)
    model.reshape(shapes or {name: ov.PartialShape(list(array.shape)) for name, array in inputs.items()})
    compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": "1"})
    result = compiled.create_infer_request().infer(inputs)
    return {port.get_any_name(): np.asarray(value) for port, value in result.items()}
