"""A TensorFlow model's signature as Triton's TensorFlow backend sees it: the SavedModel signature it
serves (chosen as Triton chooses it), or a frozen GraphDef's placeholders and fetched nodes; each
tensor's Triton data type and dims (-1 where TensorFlow does not know a size, ``None`` for a shape
the model does not give at all). Shared by the backend and config completion.

Both load into a graph of their own, run by a session, as Triton's backend and TensorFlow Serving
run them (TensorFlow's C++ SavedModel loader, then Session::Run): a call is one C++ session run of
numpy arrays in and out. The eager call of a loaded signature spent about 100 µs more per call
binding its keyword arguments in Python, and handed each call to a pool thread and back.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import invalid_arg, unavailable
from conveyor.proto.repository_files import read_bytes, read_text

log = logging.getLogger(__name__)

INSTALL = "pip install 'conveyor[tensorflow]'"
# Signatures a SavedModel keeps for itself, never served (Triton's fallback skips them).
_INTERNAL_SIGNATURES = ("__saved_model_init_op", "__saved_model_train_op")


def import_tensorflow() -> Any:
    # TensorFlow's C++ start-up chatter (oneDNN notes, CPU feature hints) goes to stderr before any
    # Python logging applies, burying the lines that matter; its errors still show.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError:
        raise unavailable(f"TensorFlow is not installed in the worker's environment ({INSTALL})") from None
    return tf


def config_types(tf: Any) -> dict[Any, int]:
    return {
        tf.bool: mc.TYPE_BOOL, tf.uint8: mc.TYPE_UINT8, tf.uint16: mc.TYPE_UINT16, tf.uint32: mc.TYPE_UINT32,
        tf.uint64: mc.TYPE_UINT64, tf.int8: mc.TYPE_INT8, tf.int16: mc.TYPE_INT16, tf.int32: mc.TYPE_INT32,
        tf.int64: mc.TYPE_INT64, tf.float16: mc.TYPE_FP16, tf.float32: mc.TYPE_FP32, tf.float64: mc.TYPE_FP64,
        tf.bfloat16: mc.TYPE_BF16, tf.string: mc.TYPE_STRING,
    }


@dataclass(frozen=True, slots=True)
class TensorInfo:
    data_type: int
    shape: list[int] | None  # None: the model does not say (unknown rank)


def _info(tf: Any, name: str, dtype: Any, shape: Any, kind: str, model: str) -> TensorInfo:
    data_type = config_types(tf).get(dtype)
    if data_type is None:
        raise unavailable(f"unable to process {kind} '{name}' for '{model}', unsupported datatype '{dtype.name}'")
    dims = None if shape.rank is None else [-1 if d is None else int(d) for d in shape.as_list()]
    return TensorInfo(data_type, dims)


@dataclass
class Signature:
    """The served tensors; ``feeds`` and ``fetches`` are the graph's tensors for ``inputs`` and
    ``outputs``, in their order; ``session`` runs the graph."""

    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]
    feeds: list[Any] = field(default_factory=list)
    fetches: list[Any] = field(default_factory=list)
    session: Any = None


def new_session(tf: Any, config: Any = None) -> tuple[Any, Any]:
    """An empty graph and a session over it (``config``: its ConfigProto)."""
    graph = tf.Graph()
    return graph, tf.compat.v1.Session(graph=graph, config=config)


def load_savedmodel(tf: Any, path: str, tag: str, signature_def: str, model: str, *, config: Any = None,
                    device: str = "") -> Signature:
    """The SavedModel at ``path`` under ``tag``, and the signature Triton serves: ``signature_def``,
    else ``serving_default``, else (with a warning) the first that is not an init or train op.
    ``device``: the ops' device (a GPU instance's), where the model does not pin them itself."""
    graph, session = new_session(tf, config)
    try:
        with graph.as_default(), graph.device(device or None):
            meta = tf.compat.v1.saved_model.loader.load(session, [tag], path, clear_devices=bool(device))
    except Exception as exc:
        session.close()
        raise unavailable(f"unable to load model '{model}' from '{path}' (tag '{tag}'): "
                          f"{' '.join(str(exc).split())[:500]}") from None
    wanted = signature_def or "serving_default"
    signatures = meta.signature_def
    if wanted not in signatures:
        others = [k for k in signatures if k not in _INTERNAL_SIGNATURES]
        if signature_def or not others:
            session.close()
            raise unavailable(f"unable to load model '{model}', expected '{wanted}' signature")
        log.warning("unable to find serving signature '%s'; using signature '%s'", wanted, others[0])
        wanted = others[0]
    found = signatures[wanted]

    def tensors(infos: Any, kind: str) -> tuple[dict[str, TensorInfo], list[Any]]:
        named = {name: graph.get_tensor_by_name(info.name) for name, info in infos.items()}
        return ({name: _info(tf, name, t.dtype, t.shape, kind, model) for name, t in named.items()},
                list(named.values()))

    inputs, feeds = tensors(found.inputs, "input")
    outputs, fetches = tensors(found.outputs, "output")
    return Signature(inputs, outputs, feeds, fetches, session)


def run_init_ops(tf: Any, signature: Signature, model_path: str, file_name: str, model: str) -> None:
    """Triton's ``TF_INIT_OPS_FILE``: run, once, the operations the JSON file ``file_name`` names
    (``{"init_ops": [...]}``), the file looked for in the version folder, then in the model's folder."""
    version_dir = os.path.dirname(model_path)
    places = [os.path.join(version_dir, file_name), os.path.join(os.path.dirname(version_dir), file_name)]
    path = next((p for p in places if os.path.isfile(p)), None)
    if path is None:
        raise unavailable(f"unable to find init ops file '{file_name}' for model '{model}' in "
                          f"'{places[0]}' or '{places[1]}'")
    try:
        names = json.loads(read_text(path))["init_ops"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise TypeError("'init_ops' is not a list of operation names")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise invalid_arg(f"unable to read init ops file '{path}' for model '{model}': "
                          f"expected {{\"init_ops\": [names]}} ({exc})") from None
    graph = signature.session.graph
    try:
        ops = [graph.get_operation_by_name(name) for name in names]
    except (KeyError, ValueError) as exc:
        raise invalid_arg(f"init ops file '{path}' of model '{model}' names an operation the graph does not "
                          f"have: {' '.join(str(exc).split())[:300]}") from None
    try:
        signature.session.run(ops)
    except Exception as exc:
        raise unavailable(f"the init ops of model '{model}' failed: {' '.join(str(exc).split())[:500]}") from None


def _tensor_name(name: str) -> str:
    """A GraphDef config name: a node (``x``, its first output) or a tensor (``x:1``)."""
    return name if ":" in name else f"{name}:0"


def load_graphdef(tf: Any, path: str, config: mc.ModelConfig, *, session_config: Any = None,
                  device: str = "") -> Signature:
    """A frozen GraphDef, fed at the config's inputs (placeholders) and fetched at its outputs: a
    GraphDef has no signature, so the config names the tensors (as in Triton, which cannot complete
    a GraphDef's config either)."""
    graph_def = tf.compat.v1.GraphDef()
    graph, session = new_session(tf, session_config)
    try:
        graph_def.ParseFromString(read_bytes(path, limit=None))  # never a FIFO's wait (proto/repository_files.py)
        with graph.as_default(), graph.device(device or None):
            tf.import_graph_def(graph_def, name="")
    except Exception as exc:
        session.close()
        raise unavailable(f"unable to load model '{config.name}' from '{path}': "
                          f"{' '.join(str(exc).split())[:500]}") from None
    placeholders = {op.name for op in graph.get_operations() if op.type == "Placeholder"}

    def find(name: str, kind: str, allowed: set[str] | None) -> Any:
        try:
            tensor = graph.get_tensor_by_name(_tensor_name(name))
        except (KeyError, ValueError):
            tensor = None
        if tensor is None or (allowed is not None and tensor.op.name not in allowed):
            what = f"allowed inputs are: {', '.join(sorted(placeholders))}" if allowed is not None else \
                "the graph has no such node"
            session.close()
            raise invalid_arg(f"unexpected inference {kind} '{name}', {what}")
        return tensor

    feeds = [find(i.name, "input", placeholders) for i in config.input]
    fetches = [find(o.name, "output", None) for o in config.output]
    unfed = _placeholders_needed(fetches) - {t.op.name for t in feeds}
    if unfed:
        session.close()
        raise invalid_arg(f"unable to load model '{config.name}': the outputs need more than the inputs the "
                          f"config declares: placeholders {', '.join(sorted(unfed))} are not fed")
    inputs = {i.name: _info(tf, i.name, t.dtype, t.shape, "input", config.name) for i, t in zip(
        config.input, feeds, strict=True)}
    outputs = {o.name: _info(tf, o.name, t.dtype, t.shape, "output", config.name) for o, t in zip(
        config.output, fetches, strict=True)}
    return Signature(inputs, outputs, feeds, fetches, session)


def _placeholders_needed(fetches: list[Any]) -> set[str]:
    """The placeholders the fetched tensors depend on (a session run fails without a value for each)."""
    seen: set[str] = set()
    found: set[str] = set()
    stack = [t.op for t in fetches]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type == "Placeholder":
            found.add(op.name)
        stack += [t.op for t in op.inputs]
        stack += list(op.control_inputs)
    return found


def check_config(config: mc.ModelConfig, signature: Signature) -> None:
    """Triton's ValidateTRITONTFModel checks, with its messages: names, count, dims, data types."""
    model, batched = config.name, config.max_batch_size > 0
    for tensor in config.input:
        if tensor.name not in signature.inputs:
            raise invalid_arg(f"unexpected inference input '{tensor.name}', allowed inputs are: "
                              f"{', '.join(sorted(signature.inputs))}")
    if len(config.input) != len(signature.inputs):
        raise invalid_arg(f"unable to load model '{model}', configuration expects {len(config.input)} inputs, "
                          f"model provides {len(signature.inputs)}")
    declared: list[tuple[str, mc.ModelInput | mc.ModelOutput, dict[str, TensorInfo]]] = [
        *(("input", t, signature.inputs) for t in config.input),
        *(("output", t, signature.outputs) for t in config.output)]
    for kind, io, found in declared:
        info = found.get(io.name)
        if info is None:
            raise invalid_arg(f"unexpected inference {kind} '{io.name}', allowed {kind}s are: "
                              f"{', '.join(sorted(found))}")
        dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
        if info.shape:  # a model that gives no shape takes the config's
            _compare_dims(model, io.name, info.shape, dims, batched)
        if info.data_type != io.data_type:
            raise invalid_arg(f"unable to load model '{model}', configuration expects datatype "
                              f"{mc.DataType.Name(io.data_type)} for {kind} '{io.name}', model provides "
                              f"{mc.DataType.Name(info.data_type)}")


def _shape_text(shape: list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _compare_dims(model: str, name: str, shape: list[int], dims: list[int], batched: bool) -> None:
    """Triton's CompareDims (not exact): a model dimension of -1 takes any size."""
    full = [-1, *dims] if batched else dims
    if batched and shape[0] != -1:
        raise invalid_arg(f"model '{model}', tensor '{name}': for the model to support batching the shape should "
                          f"have at least 1 dimension and the first dimension must be -1; but shape expected by the "
                          f"model is {_shape_text(shape)}")
    if len(shape) != len(full) or any(m != -1 and m != d for m, d in zip(shape, full, strict=True)):
        what = (f"{len(full)} dimensions (an initial batch dimension because max_batch_size > 0 followed by the "
                f"explicit tensor shape, making complete shape {_shape_text(full)})" if batched
                else f"{len(full)} dimensions (shape {_shape_text(full)})")
        raise invalid_arg(f"model '{model}', tensor '{name}': the model expects {len(shape)} dimensions (shape "
                          f"{_shape_text(shape)}) but the model configuration specifies {what}")

