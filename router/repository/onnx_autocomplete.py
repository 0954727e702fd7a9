"""Triton's config auto-completion for ONNX models: a model directory with no
``config.pbtxt`` (or one without inputs/outputs) is completed from the graph.

As in Triton: when every input and output has a variable first dimension, the
model is taken to be batched (``max_batch_size`` 4, dynamic batching on) unless
the config already set ``max_batch_size``.

A model directory (``<version>/model.onnx/`` with ``model.onnx`` and its external
data inside) is read from its ``model.onnx``. Only the graph's signature is read, never
the weights, whether inside the graph or in external data (``proto/onnx_graph.py``): this runs
on the router's repository agent, beside its loop thread.
"""

from __future__ import annotations

import os

import onnx

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.onnx_graph import read_signature
from conveyor.proto.repository_files import unreadable

DEFAULT_MAX_BATCH_SIZE = 4

_ONNX_TO_CONFIG: dict[int, int] = {
    onnx.TensorProto.FLOAT: mc.TYPE_FP32,
    onnx.TensorProto.FLOAT16: mc.TYPE_FP16,
    onnx.TensorProto.DOUBLE: mc.TYPE_FP64,
    onnx.TensorProto.BFLOAT16: mc.TYPE_BF16,
    onnx.TensorProto.INT8: mc.TYPE_INT8,
    onnx.TensorProto.INT16: mc.TYPE_INT16,
    onnx.TensorProto.INT32: mc.TYPE_INT32,
    onnx.TensorProto.INT64: mc.TYPE_INT64,
    onnx.TensorProto.UINT8: mc.TYPE_UINT8,
    onnx.TensorProto.UINT16: mc.TYPE_UINT16,
    onnx.TensorProto.UINT32: mc.TYPE_UINT32,
    onnx.TensorProto.UINT64: mc.TYPE_UINT64,
    onnx.TensorProto.BOOL: mc.TYPE_BOOL,
    onnx.TensorProto.STRING: mc.TYPE_STRING,
}


def _dims(value: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim]


def complete_onnx(config: mc.ModelConfig, model_path: str, max_batch_size_given: bool,
                  default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> str:
    """Fill missing inputs/outputs (and batching) of ``config`` from the ONNX file; '' or a reason.
    ``default_max_batch_size`` is --backend-config's default-max-batch-size (0: never batched)."""
    if os.path.isdir(model_path):  # <version>/model.onnx/ holds model.onnx and its external data
        model_path = os.path.join(model_path, "model.onnx")
    try:
        graph = read_signature(model_path)
    except OSError as exc:  # not a regular file, unreadable
        return unreadable(model_path, exc)
    except Exception as exc:
        return f"cannot read '{model_path}' to complete its config: {exc}"
    sb = config.sequence_batching
    # The server feeds sequence control and state tensors itself: they are not the client's to send.
    internal = {i.name for i in graph.initializer} | {c.name for c in sb.control_input}
    internal |= {s.input_name for s in sb.state}
    internal |= {t for bi in config.batch_input for t in bi.target_name}  # ragged batching's batch inputs
    inputs = [v for v in graph.input if v.name not in internal]
    state_outputs = {s.output_name for s in sb.state}
    outputs = [v for v in graph.output if v.name not in state_outputs]
    tensors = [*inputs, *outputs]
    batched = config.max_batch_size > 0
    if not max_batch_size_given:
        batched = default_max_batch_size > 0 and bool(tensors) and all(_dims(v)[:1] == [-1] for v in tensors)
        if batched:
            config.max_batch_size = default_max_batch_size
            if not config.HasField("dynamic_batching") and not config.HasField("sequence_batching"):
                config.dynamic_batching.SetInParent()
    elif batched and not all(_dims(v)[:1] == [-1] for v in tensors):  # Triton's onnxruntime backend's words
        return (f"autofill failed for model '{config.name}': model does not support batching while non-zero "
                "max_batch_size is specified")
    for values, declared in ((inputs, config.input), (outputs, config.output)):
        if len(declared):
            continue
        for v in values:
            dtype = _ONNX_TO_CONFIG.get(v.type.tensor_type.elem_type)
            if dtype is None:
                return f"tensor '{v.name}' has an ONNX type Conveyor cannot serve"
            dims = _dims(v)[1:] if batched else _dims(v)
            declared.add(name=v.name, data_type=dtype, dims=dims)
    return ""
