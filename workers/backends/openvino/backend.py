"""Models on OpenVINO (``backend: "openvino"``), as Triton's openvino_backend loads them:
``<version>/model.xml`` (+ ``model.bin``), or whatever ``default_model_filename`` names that
OpenVINO reads (``model.onnx``, ``model.pdmodel``, ``model.tflite``, a SavedModel directory).

At load, as Triton: the config's inputs and outputs are checked against the model's (names,
count, dimensions), their element types set to the config's with OpenVINO's pre/post-processor
(OpenVINO converts), and with ``RESHAPE_IO_LAYERS`` the inputs reshaped to the config's dims
(``-1`` dynamic). A batched model (``max_batch_size`` > 0) gets a dynamic first dimension, so a
batch of any size up to ``max_batch_size`` runs as it is (Triton fixes it at ``max_batch_size``
and fails smaller batches unless ``ENABLE_BATCH_PADDING``); ``SKIP_OV_DYNAMIC_BATCHSIZE`` keeps
Triton's static batch, for topologies that cannot take a dynamic one, padding smaller batches
when ``ENABLE_BATCH_PADDING`` says so.

Per call: one ``InferRequest.infer`` on the batch's arrays, shared with OpenVINO rather than
copied in (``share_inputs``), and the outputs read as views of the request's own buffers
(``share_outputs``): the worker copies them into its arena before this instance runs again.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import internal, invalid_arg, unavailable
from conveyor.proto.repository_files import check_regular, unreadable
from conveyor.workers.backends.openvino.settings import OpenVinoSettings

try:
    import openvino as ov
    from openvino.preprocess import PrePostProcessor
except ImportError:  # this module is imported only to load a model: say why it cannot be
    raise unavailable("OpenVINO is not installed in the worker's environment "
                      "(pip install 'conveyor[openvino]')") from None

log = logging.getLogger(__name__)

# Triton's config types that OpenVINO tensors hold (its ModelConfigDataTypeToOpenVINOElement, plus FP64).
ELEMENT_TYPES: dict[int, Any] = {
    mc.TYPE_BOOL: ov.Type.boolean, mc.TYPE_UINT8: ov.Type.u8, mc.TYPE_UINT16: ov.Type.u16,
    mc.TYPE_UINT32: ov.Type.u32, mc.TYPE_UINT64: ov.Type.u64, mc.TYPE_INT8: ov.Type.i8, mc.TYPE_INT16: ov.Type.i16,
    mc.TYPE_INT32: ov.Type.i32, mc.TYPE_INT64: ov.Type.i64, mc.TYPE_FP16: ov.Type.f16, mc.TYPE_FP32: ov.Type.f32,
    mc.TYPE_FP64: ov.Type.f64,
}


def _dims(tensor: mc.ModelInput | mc.ModelOutput) -> list[int]:
    return list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)


def _shape_text(shape: list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _signed(shape: Any) -> list[int]:
    return [d.get_length() if d.is_static else -1 for d in shape]


def _fits(model_dim: Any, config_dim: int) -> bool:
    """Triton's doesMatch, with a config -1 taking any model dimension."""
    if config_dim == -1 or (model_dim.is_dynamic and model_dim.get_max_length() < 0):
        return True
    if model_dim.is_static:
        return bool(model_dim.get_length() == config_dim)
    return bool(model_dim.get_min_length() <= config_dim <= model_dim.get_max_length())


def check_model_files(path: str, model: str) -> None:
    """UNAVAILABLE unless the model (``model.xml``, or an ONNX file or folder OpenVINO reads) and the
    weights beside an IR (``model.bin``) are regular files: OpenVINO opens them by name, and a FIFO would
    hold the instance's thread for ever (proto/repository_files.py). A name swapped after this is not seen."""
    try:
        check_regular(path, directory_ok=True)
    except FileNotFoundError:
        raise unavailable(f"unable to find '{path}' for model '{model}'") from None
    except OSError as exc:
        raise unavailable(unreadable(path, exc)) from None
    weights = os.path.splitext(path)[0] + ".bin"
    if path.endswith(".xml"):
        try:
            check_regular(weights)
        except FileNotFoundError:
            pass  # OpenVINO's own error names it
        except OSError as exc:
            raise unavailable(unreadable(weights, exc)) from None


class OpenVinoBackend:
    # Short batches may run on the worker's main thread (workers/inline.py): an infer request is
    # not tied to a thread.
    runs_on_any_thread = True

    def __init__(self, path: str, config: mc.ModelConfig, device: str) -> None:
        if device.startswith("cuda"):
            raise unavailable(f"unable to load model '{config.name}', Triton OpenVINO backend supports only "
                              f"Kind CPU and AUTO")
        check_model_files(path, config.name)
        self.settings = settings = OpenVinoSettings.from_config(config)
        self.name = config.name
        core = ov.Core()
        try:
            if settings.cpu_extension:
                core.add_extension(settings.cpu_extension)
            if settings.cache_dir:
                core.set_property({"CACHE_DIR": settings.cache_dir})
            model = core.read_model(path)
        except Exception as exc:
            raise unavailable(f"OpenVINO could not read '{path}': {_one_line(exc)}") from None
        self.max_batch_size = config.max_batch_size
        self.static_batch = config.max_batch_size > 0 and settings.skip_dynamic_batch
        model = self._configure(model, config)
        try:
            self.compiled = core.compile_model(model, settings.device, settings.properties)
            self.request = self.compiled.create_infer_request()
        except Exception as exc:
            raise unavailable(f"OpenVINO could not compile model '{config.name}' for {settings.device}: "
                              f"{_one_line(exc)}") from None
        self.outputs = {o.name: self.compiled.output(o.name) for o in config.output}
        log.info("model '%s': OpenVINO %s on %s, %s", config.name, ov.get_version(), settings.device,
                 ", ".join(f"{k}={v}" for k, v in settings.properties.items()))

    def _configure(self, model: Any, config: mc.ModelConfig) -> Any:
        """Check the config against the model, then set element types and shapes (Triton's
        ValidateInputs/ValidateOutputs)."""
        batched = config.max_batch_size > 0
        inputs = {name: port for port in model.inputs for name in port.get_names()}
        if len(config.input) != len(model.inputs):
            raise invalid_arg(f"unable to load model '{config.name}', configuration expects {len(config.input)} "
                              f"inputs, model provides {len(model.inputs)}")
        batch = ov.Dimension(config.max_batch_size) if self.static_batch else ov.Dimension()
        shapes: dict[str, Any] = {}
        for tensor in config.input:
            port = inputs.get(tensor.name)
            if port is None:
                raise invalid_arg(f"unexpected inference input '{tensor.name}', allowed inputs are: "
                                  f"{', '.join(sorted(inputs))}")
            dims, model_shape = _dims(tensor), port.get_partial_shape()
            if self.settings.reshape_io:
                shape = [batch] if batched else []
                shape += [ov.Dimension() if d == -1 else ov.Dimension(d) for d in dims]
                shapes[tensor.name] = ov.PartialShape(shape)
                continue
            self._compare(tensor.name, model_shape, dims, batched, inputs=True)
            if batched:
                shapes[tensor.name] = ov.PartialShape([batch, *list(model_shape)[1:]])
        if shapes:
            try:
                model.reshape(shapes)
            except Exception as exc:
                hint = ("" if self.static_batch or not batched else " (a model whose topology cannot take a "
                        "dynamic batch dimension serves with SKIP_OV_DYNAMIC_BATCHSIZE: YES)")
                raise invalid_arg(f"model '{config.name}': OpenVINO cannot reshape its inputs to "
                                  f"{ {n: str(s) for n, s in shapes.items()} }{hint}: {_one_line(exc)}") from None
            if batched and not self.static_batch and _fixed_batch_outputs(model):
                self._static_after_all(model, config, shapes)
        outputs = {name: port for port in model.outputs for name in port.get_names()}
        for out in config.output:
            port = outputs.get(out.name)
            if port is None:
                raise invalid_arg(f"unexpected inference output '{out.name}', allowed outputs are: "
                                  f"{', '.join(sorted(outputs))}")
            self._compare(out.name, port.get_partial_shape(), _dims(out), batched, inputs=False)
        ppp = PrePostProcessor(model)
        declared: list[tuple[str, mc.ModelInput | mc.ModelOutput]] = [
            *(("input", t) for t in config.input), *(("output", t) for t in config.output)]
        for kind, io in declared:
            element = ELEMENT_TYPES.get(io.data_type)
            if element is None:
                raise invalid_arg(f"unsupported datatype {mc.DataType.Name(io.data_type)} for {kind} "
                                  f"'{io.name}' for model '{config.name}'")
            side = ppp.input(io.name) if kind == "input" else ppp.output(io.name)
            side.tensor().set_element_type(element)
        return ppp.build()

    def _static_after_all(self, model: Any, config: mc.ModelConfig, shapes: dict[str, Any]) -> None:
        """A model whose outputs keep a fixed batch dimension with dynamic inputs (a Reshape to a constant
        shape, as Triton's QA models have) would read past a smaller batch's input: it gets Triton's static
        batch of ``max_batch_size`` instead, smaller batches padded when ``ENABLE_BATCH_PADDING`` says so."""
        self.static_batch = True
        static = {name: ov.PartialShape([ov.Dimension(config.max_batch_size), *list(shape)[1:]])
                  for name, shape in shapes.items()}
        try:
            model.reshape(static)
        except Exception as exc:
            raise invalid_arg(f"model '{config.name}': OpenVINO cannot reshape its inputs to "
                              f"{ {n: str(s) for n, s in static.items()} }: {_one_line(exc)}") from None
        log.warning("model '%s': its outputs keep a fixed batch dimension, so it runs with a static batch of %d "
                    "(as with SKIP_OV_DYNAMIC_BATCHSIZE: YES)", config.name, config.max_batch_size)

    def _compare(self, name: str, model_shape: Any, dims: list[int], batched: bool, inputs: bool) -> None:
        """Triton's CompareDimsSupported: the config's shape (after the batch dimension) must fit the model's."""
        dimensions = list(model_shape)
        if batched:
            if not dimensions:
                raise invalid_arg(f"model '{self.name}', tensor '{name}': for the model to support batching the "
                                  f"shape should have at least 1 dimension")
            full = [self.max_batch_size, *dims]
            fits = len(dimensions) == len(full) and all(_fits(m, d) for m, d in zip(dimensions[1:], dims, strict=True))
            if not fits:
                raise invalid_arg(
                    f"model '{self.name}', tensor '{name}': the model expects {len(dimensions)} dimensions (shape "
                    f"{_shape_text(_signed(dimensions))}) but the model configuration specifies {len(full)} "
                    f"dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit "
                    f"tensor shape, making complete shape {_shape_text(full)})")
        elif len(dimensions) != len(dims) or not all(_fits(m, d) for m, d in zip(dimensions, dims, strict=True)):
            raise invalid_arg(f"model '{self.name}', tensor '{name}': the model expects {len(dimensions)} dimensions "
                              f"(shape {_shape_text(_signed(dimensions))}) but the model configuration specifies "
                              f"{len(dims)} dimensions (shape {_shape_text(dims)})")

    def execute(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        rows = 0
        if self.static_batch:
            rows = next(iter(inputs.values())).shape[0]
            if rows != self.max_batch_size:
                inputs = self._padded(inputs, rows)
        try:
            result = self.request.infer(inputs, share_inputs=True, share_outputs=True)
        except Exception as exc:
            raise internal(f"OpenVINO inference failed: {_one_line(exc)}") from None
        if rows and rows != self.max_batch_size:
            return {name: result[self.outputs[name]][:rows] for name in outputs}
        return {name: result[self.outputs[name]] for name in outputs}

    def _padded(self, inputs: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """A batch smaller than the model's static one, zero-padded (``ENABLE_BATCH_PADDING``)."""
        if not self.settings.batch_padding:
            raise internal(f"expected requests with batch size '{self.max_batch_size}', got '{rows}'... this error "
                           f"can be avoided by setting 'ENABLE_BATCH_PADDING' parameter in model configuration to "
                           f"'YES' at a performance cost.")
        padded = {}
        for name, array in inputs.items():
            full = np.zeros((self.max_batch_size, *array.shape[1:]), dtype=array.dtype)
            full[:rows] = array
            padded[name] = full
        return padded

    def close(self) -> None:
        del self.request
        del self.compiled


def _fixed_batch_outputs(model: Any) -> bool:
    """Some output's first dimension stays static while the inputs' batch is dynamic."""
    for port in model.outputs:
        shape = port.get_partial_shape()
        if shape.rank.is_dynamic:
            continue
        if len(shape) == 0 or shape[0].is_static:
            return True
    return False


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:600]
