"""Completes a TensorFlow SavedModel's config from its signature, as Triton's TensorFlow backend does
(its ``AutoCompleteHelper``), in a process of its own:

    python -m conveyor.workers.backends.tensorflow.autocomplete < request.json > config.json

The request: ``{"config": <config JSON>, "model_path": ..., "max_batch_size_given": bool,
"default_max_batch_size": int}`` (``router/repository/frameworks.py`` sends it). Exit status 0
with the completed config on stdout, or 1 with the reason as the last line of stderr.

Triton's rules: the signature supports batching when every tensor with a known shape has -1 first;
declared tensors hint whether the config means it (dims one shorter than the model's rank); with
``max_batch_size`` 0 a batching model gets ``default-max-batch-size``, and above 1 dynamic batching
unless the config has a scheduler. Declared tensors get their missing type and dims; undeclared
inputs (not batch or sequence control inputs) are added; outputs are all added when none is
declared. A tensor with no dims after the batch one gets dims [1] and an empty ``reshape``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_text
from conveyor.proto.errors import ConveyorError, unavailable
from conveyor.proto.model_config import from_json, to_json
from conveyor.workers.backends.tensorflow.signature import (
    TensorInfo,
    import_tensorflow,
    load_savedmodel,
)


def _batch_hint(config: mc.ModelConfig, inputs: dict[str, TensorInfo], outputs: dict[str, TensorInfo]) -> bool:
    """Whether the tensors the config declares say it batches (Triton's explicit hints)."""
    hint: bool | None = None
    batches = False
    declared: list[tuple[mc.ModelInput | mc.ModelOutput, dict[str, TensorInfo]]] = [
        *((t, inputs) for t in config.input), *((t, outputs) for t in config.output)]
    for io, found in declared:
        if getattr(io, "allow_ragged_batch", False):
            return True
        info = found.get(io.name)
        if info is None or not info.shape:
            continue
        dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
        if not dims:
            batches = batches or hint is None
            continue
        says = len(dims) == len(info.shape) - 1
        if hint is not None and hint != says:
            raise unavailable(f"unable to autofill for '{config.name}', model tensor configurations are contradicting "
                              f"each other in terms of whether batching is supported")
        hint, batches = says, says
    return batches


def _fill(config: mc.ModelConfig, io: mc.ModelInput | mc.ModelOutput, info: TensorInfo, batching: bool) -> None:
    if io.data_type == mc.TYPE_INVALID:
        io.data_type = info.data_type  # type: ignore[assignment]
    if len(io.dims):
        return
    if not info.shape:
        raise unavailable(f"Unable to autofill for '{config.name}': the rank of model tensor '{io.name}' is 0 and "
                          f"dimensions are not defined")
    dims = info.shape[1:] if batching else info.shape
    io.dims.extend(dims or [1])
    if not dims:
        io.reshape.SetInParent()  # a [batch]-only tensor: one element per request, shaped [] for the model


def complete(request: dict[str, Any]) -> dict[str, Any]:
    config = from_json(request["config"])
    tf = import_tensorflow()
    # The config may pick another MetaGraph or signature, as it does for serving.
    signature = load_savedmodel(tf, request["model_path"], parameter_text(config, "TF_GRAPH_TAG") or "serve",
                                parameter_text(config, "TF_SIGNATURE_DEF"), config.name)
    inputs, outputs = signature.inputs, signature.outputs
    supports = all(not info.shape or info.shape[0] == -1 for info in [*inputs.values(), *outputs.values()])
    if not supports and config.max_batch_size > 0:
        raise unavailable(f"unable to autofill for '{config.name}', configuration specified max-batch "
                          f"{config.max_batch_size} but model signature does not support batching")
    default_max = int(request.get("default_max_batch_size", 4))
    hint = supports and (_batch_hint(config, inputs, outputs) if len(config.input) or len(config.output) else True)
    batching = hint and default_max > 0
    if config.max_batch_size == 0:
        config.max_batch_size = default_max if batching else 0
    batching = config.max_batch_size > 0
    if config.max_batch_size > 1 and not (config.HasField("dynamic_batching")
                                          or config.HasField("sequence_batching")):
        config.dynamic_batching.SetInParent()
    remaining = dict(inputs)
    for io in config.input:
        if io.name in remaining:
            _fill(config, io, remaining.pop(io.name), batching)
    internal = {t for bi in config.batch_input for t in bi.target_name}
    internal |= {c.name for c in config.sequence_batching.control_input}
    for name, info in remaining.items():
        if name not in internal:
            _fill(config, config.input.add(name=name), info, batching)
    if not len(config.output):
        for name, info in outputs.items():
            if not info.shape:
                raise unavailable(f"Unable to autofill for '{config.name}': the rank of model tensor '{name}' is 0 "
                                  f"which is not supported")
            _fill(config, config.output.add(name=name), info, batching)
    else:
        for out in config.output:
            if out.name in outputs:
                _fill(config, out, outputs[out.name], batching)
    return to_json(config)


def main() -> int:
    try:
        completed = complete(json.loads(sys.stdin.read()))
    except ConveyorError as exc:
        sys.stderr.write("\n" + " ".join(exc.message.split()) + "\n")
        return 1
    except Exception as exc:
        sys.stderr.write(f"\ncompleting the config failed: {type(exc).__name__}: {' '.join(str(exc).split())}\n")
        return 1
    sys.stdout.write(json.dumps(completed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
