"""Completes an OpenVINO model's config from the model, as Triton's openvino_backend does
(its ``AutoCompleteConfig``), in a process of its own:

    python -m conveyor.workers.backends.openvino.autocomplete < request.json > config.json

The request: ``{"config": <config JSON>, "model_path": ..., "max_batch_size_given": bool,
"default_max_batch_size": int}`` (``router/repository/frameworks.py`` sends it). Exit status 0
with the completed config on stdout, or 1 with the reason as the last line of stderr.

Triton's rules: a model whose every input and output layout has a batch dimension (``N``) can
batch; then a ``max_batch_size`` of 0 becomes ``--backend-config``'s default-max-batch-size (at
least 1), and above 1 dynamic batching is turned on unless the config has a scheduler. Inputs
and outputs the config does not declare come from the model: name, type, and dims (after the
batch dimension when batching). Conveyor keeps each static dimension of a partly dynamic shape
(Triton writes -1 for every dimension of such a shape).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from conveyor.proto.errors import ConveyorError, unavailable
from conveyor.proto.model_config import from_json, to_json


def complete(request: dict[str, Any]) -> dict[str, Any]:
    config = from_json(request["config"])
    try:
        import openvino as ov
    except ImportError:
        raise unavailable("OpenVINO is not installed (pip install 'conveyor[openvino]'), so the config "
                          "cannot be completed from the model") from None
    from conveyor.workers.backends.openvino.backend import ELEMENT_TYPES

    path = request["model_path"]
    try:
        model = ov.Core().read_model(path)
    except Exception as exc:
        raise unavailable(f"OpenVINO could not read '{path}' to complete its config: "
                          f"{' '.join(str(exc).split())[:500]}") from None
    ports = [*model.inputs, *model.outputs]
    batching = bool(ports) and all(ov.layout_helpers.has_batch(ov.layout_helpers.get_layout(p)) for p in ports)
    if batching:
        if config.max_batch_size == 0:
            config.max_batch_size = max(int(request.get("default_max_batch_size", 4)), 1)
        if config.max_batch_size > 1 and not (config.HasField("dynamic_batching")
                                              or config.HasField("sequence_batching")):
            config.dynamic_batching.SetInParent()
    types = {element.get_type_name(): data_type for data_type, element in ELEMENT_TYPES.items()}
    skip = 1 if config.max_batch_size > 0 else 0
    for declared, found in ((config.input, model.inputs), (config.output, model.outputs)):
        if len(declared):
            continue
        for port in found:
            element = port.get_element_type().get_type_name()
            if element not in types:
                raise unavailable(f"tensor '{port.get_any_name()}' has OpenVINO element type {element}, "
                                  f"which no Triton data type maps to")
            shape = port.get_partial_shape()
            dims = [d.get_length() if d.is_static else -1 for d in list(shape)[skip:]]
            declared.add(name=port.get_any_name(), data_type=types[element], dims=dims)
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

