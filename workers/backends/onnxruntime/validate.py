"""A config checked against the ONNX session it loads, as Triton's onnxruntime backend checks it when
an instance is created (its ValidateInputs, ValidateOutputs and sequence-control checks), with its
messages: a config that names a tensor the model lacks, or gives it another datatype or shape, fails the
load instead of failing every request."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status, internal, invalid_arg

# ORT's element types (its Python names) as Triton's datatypes, and as ORT's own C names (OnnxDataTypeName).
_TRITON = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64", "tensor(int8)": "INT8", "tensor(int16)": "INT16", "tensor(int32)": "INT32",
    "tensor(int64)": "INT64", "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(string)": "BYTES", "tensor(bfloat16)": "BF16",
}
_ONNX_NAME = {
    "tensor(float)": "FLOAT", "tensor(uint8)": "UINT8", "tensor(int8)": "INT8", "tensor(uint16)": "UINT16",
    "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64", "tensor(string)": "STRING",
    "tensor(bool)": "BOOL", "tensor(float16)": "FLOAT16", "tensor(double)": "DOUBLE", "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64", "tensor(bfloat16)": "BFLOAT16",
}
# The config's datatypes ORT holds (ModelConfigDataTypeToOnnxDataType), as ORT's Python type names.
_CONFIG: dict[int, str] = {
    mc.TYPE_BOOL: "tensor(bool)", mc.TYPE_UINT8: "tensor(uint8)", mc.TYPE_UINT16: "tensor(uint16)",
    mc.TYPE_UINT32: "tensor(uint32)", mc.TYPE_UINT64: "tensor(uint64)", mc.TYPE_INT8: "tensor(int8)",
    mc.TYPE_INT16: "tensor(int16)", mc.TYPE_INT32: "tensor(int32)", mc.TYPE_INT64: "tensor(int64)",
    mc.TYPE_BF16: "tensor(bfloat16)", mc.TYPE_FP16: "tensor(float16)", mc.TYPE_FP32: "tensor(float)",
    mc.TYPE_FP64: "tensor(double)", mc.TYPE_STRING: "tensor(string)",
}
_CONTROLS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_CORRID")


def shape_text(shape: Iterable[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _dims(shape: Any) -> list[int]:
    """ORT's shape, a symbolic or unknown dimension as -1 (as its C API gives them)."""
    return [d if isinstance(d, int) and d >= 0 else -1 for d in (shape or [])]


def _tensor_dims(tensor: mc.ModelInput | mc.ModelOutput) -> list[int]:
    return list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)


def compare_dims(model: str, tensor: str, model_shape: list[int], dims: list[int], max_batch_size: int,
                 exact: bool) -> None:
    """Triton's CompareDimsSupported (onnxruntime_utils.cc): a config -1 or model -1 matches anything unless
    ``exact`` (outputs), where they must be the same."""
    if max_batch_size > 0:
        if not model_shape or model_shape[0] != -1:
            raise invalid_arg(f"model '{model}', tensor '{tensor}': for the model to support batching the shape "
                              f"should have at least 1 dimension and the first dimension must be -1; but shape "
                              f"expected by the model is {shape_text(model_shape)}")
        full = [-1, *dims]
        fits = len(model_shape) == len(full) and all(
            m == d for m, d in zip(model_shape, full, strict=True) if exact or m != -1)
        if not fits:
            raise invalid_arg(
                f"model '{model}', tensor '{tensor}': the model expects {len(model_shape)} dimensions (shape "
                f"{shape_text(model_shape)}) but the model configuration specifies {len(full)} dimensions (an "
                f"initial batch dimension because max_batch_size > 0 followed by the explicit tensor shape, "
                f"making complete shape {shape_text(full)})")
        return
    fits = len(model_shape) == len(dims) and all(
        m == d for m, d in zip(model_shape, dims, strict=True) if exact or m != -1)
    if not fits:
        raise invalid_arg(f"model '{model}', tensor '{tensor}': the model expects {len(model_shape)} dimensions "
                          f"(shape {shape_text(model_shape)}) but the model configuration specifies {len(dims)} "
                          f"dimensions (shape {shape_text(dims)})")


def _scalar(model: str, tensor: str, dims: list[int]) -> None:
    if any(d != 1 for d in dims):
        raise invalid_arg(f"unable to load model '{model}', scalar tensor '{tensor}', should only provide 1 in the "
                          f"model configuration when the model doesn't support batching. Model configuration "
                          f"provided: {shape_text(dims)}.")


def _allowed(kind: str, name: str, names: Iterable[str]) -> ConveyorError:
    """Triton's CheckAllowedModelInput / CheckAllowedModelOutput (names in std::set order)."""
    return invalid_arg(f"unexpected inference {kind} '{name}', allowed {kind}s are: {', '.join(sorted(names))}")


def _datatype(model: str, kind: str, name: str, data_type: int, found: str) -> None:
    wanted = _CONFIG.get(data_type)
    config_type = mc.DataType.Name(data_type)
    if wanted is None:
        raise internal(f"unsupported datatype {config_type} for {kind} '{name}' for model '{model}'")
    if wanted != found:
        raise invalid_arg(f"unable to load model '{model}', configuration expects datatype {config_type} for {kind} "
                          f"'{name}', model provides TYPE_{_TRITON.get(found, 'INVALID')}")


def check_session(session: Any, config: mc.ModelConfig) -> None:
    """Raise Triton's error for the first way ``config`` does not fit ``session``'s inputs and outputs."""
    model, batch = config.name, config.max_batch_size
    inputs = {i.name: i for i in session.get_inputs()}
    initializers = {i.name: i for i in session.get_overridable_initializers()}
    controls = _controls(session, config, inputs) if config.HasField("sequence_batching") else 0
    expected = sum(1 for t in config.input if not t.optional) + len(config.batch_input) + controls
    if config.HasField("sequence_batching"):
        expected += len(config.sequence_batching.state)
    if len(inputs) != expected:
        raise invalid_arg(f"unable to load model '{model}', configuration expects {expected} inputs, model "
                          f"provides {len(inputs)}")
    known = {**inputs, **initializers}
    for tensor in config.input:
        if tensor.optional and batch != 0:
            raise invalid_arg(f"unable to load model '{model}', optional input '{tensor.name}' is not supported for "
                              f"models that support batching")
        found = known.get(tensor.name)
        if found is None:
            raise _allowed("input", tensor.name, known)
        _datatype(model, "input", tensor.name, tensor.data_type, found.type)
        dims, shape = _tensor_dims(tensor), _dims(found.shape)
        if tensor.optional and tensor.allow_ragged_batch:
            raise invalid_arg(f"unable to load model '{model}', configuration expects model provides input with "
                              f"shape [-1] for ragged input '{tensor.name}', which is not supported for optional "
                              f"input")
        if tensor.allow_ragged_batch:
            if shape != [-1]:
                raise invalid_arg(f"unable to load model '{model}', configuration expects model provides input "
                                  f"with shape [-1]  for ragged input '{tensor.name}', model provides "
                                  f"{shape_text(shape)}")
        elif shape:
            compare_dims(model, tensor.name, shape, dims, batch, exact=False)
        else:
            _scalar(model, tensor.name, dims)
    outputs = {o.name: o for o in session.get_outputs()}
    batch_outputs = {name for b in config.batch_output for name in b.target_name}
    for output in config.output:
        found = outputs.get(output.name)
        if found is None:
            raise _allowed("output", output.name, outputs)
        _datatype(model, "output", output.name, output.data_type, found.type)
        if output.name in batch_outputs:
            continue
        dims, shape = _tensor_dims(output), _dims(found.shape)
        if shape:
            compare_dims(model, output.name, shape, dims, batch, exact=True)
        else:
            _scalar(model, output.name, dims)
    if config.HasField("sequence_batching"):
        for state in config.sequence_batching.state:
            found = outputs.get(state.output_name)
            if found is None:
                raise _allowed("output", state.output_name, outputs)
            wanted = _CONFIG.get(state.data_type)
            if wanted is None:
                raise internal(f"unsupported datatype {mc.DataType.Name(state.data_type)} for output state "
                               f"'{state.output_name}' for model '{model}'")
            if wanted != found.type:
                raise invalid_arg(f"unable to load model '{model}', configuration expects datatype "
                                  f"{mc.DataType.Name(state.data_type)} for output state '{state.output_name}', "
                                  f"model provides TYPE_{_TRITON.get(found.type, 'INVALID')}")


def _controls(session: Any, config: mc.ModelConfig, inputs: dict[str, Any]) -> int:
    """The sequence controls the config names, each checked against the model's input (Triton's
    ValidateBooleanSequenceControl / ValidateTypedSequenceControl): how many there are."""
    count = 0
    for kind in _CONTROLS:
        found_control = _control(config.sequence_batching, kind)
        if found_control is None:
            continue
        name, data_type = found_control
        count += 1
        found = inputs.get(name)
        if found is None:
            raise ConveyorError(Status.INTERNAL, f"configuration specified sequence control '{name}', but model "
                                                 f"does not provide that input")
        shape = _dims(found.shape)
        debatched = shape[1:] if config.max_batch_size > 0 else shape
        if debatched != [1]:
            raise invalid_arg(f"unable to load model '{config.name}', sequence control '{name}' in model has dims "
                              f"{shape_text(debatched)} but dims [1] is expected")
        if _CONFIG.get(data_type) != found.type:
            raise invalid_arg(f"unable to load model '{config.name}', sequence control '{name}', the model expects "
                              f"data-type {_ONNX_NAME.get(found.type, 'UNDEFINED')} but the model configuration "
                              f"specifies data-type {mc.DataType.Name(data_type)}")
    return count


def _control(batching: mc.ModelSequenceBatching, kind: str) -> tuple[str, int] | None:
    """The tensor name and datatype of the control of ``kind`` the config gives, if any."""
    wanted = getattr(mc.ModelSequenceBatching.Control, kind)
    for control_input in batching.control_input:
        for control in control_input.control:
            if control.kind == wanted:
                if control.int32_false_true:
                    data_type = mc.TYPE_INT32
                elif control.fp32_false_true:
                    data_type = mc.TYPE_FP32
                elif control.bool_false_true:
                    data_type = mc.TYPE_BOOL
                else:
                    data_type = control.data_type
                return control_input.name, data_type
    return None
