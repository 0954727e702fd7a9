"""Which requests may share a batch: each request's batch key, computed once on
arrival (``Pending.shape_key``); the batchers put together only requests with
equal keys (router/scheduling/batcher.py, router/scheduling/sequences.py).

* By default, as in Triton: every input's datatype and non-batch dims.
* A ragged input (``allow_ragged_batch``) counts by name and datatype only: the
  worker concatenates its elements, whatever the shapes.
* A padded input (``conveyor.pad_batching``) counts by name, datatype and rank:
  the worker pads its variable dims. With buckets, a request longer than the
  largest bucket is refused here (INVALID_ARG), before it waits in a queue.
"""

from __future__ import annotations

from collections.abc import Callable

from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.batch_shapes import PAD_BATCHING, BatchShapes
from conveyor.proto.errors import invalid_arg
from conveyor.router.pending import equal_shapes

BatchKey = Callable[[m.InferRequest], tuple[object, ...]]


def batch_key(config: mc.ModelConfig, model: str) -> BatchKey:
    """The key function of a model version (its config was checked at load)."""
    batched = config.max_batch_size > 0
    try:
        shapes = BatchShapes.from_config(config)
    except ValueError:  # such a version never serves (repository.validate said why)
        shapes = BatchShapes()
    if not batched:
        return unbatched
    if not (shapes.ragged or shapes.padded):
        return equal_shapes
    ragged = shapes.ragged
    padded = {name: spec.positions for name, spec in shapes.padded.items()}
    largest = shapes.buckets[-1] if shapes.buckets else 0

    def key(request: m.InferRequest) -> tuple[object, ...]:
        parts: list[object] = []
        for t in request.inputs:
            if t.name in ragged:
                parts.append((t.name, t.datatype))
                continue
            positions = padded.get(t.name)
            if positions is None:
                parts.append((t.name, t.datatype, *t.shape[1:]))
                continue
            if largest:
                for p in positions:
                    if p + 1 < len(t.shape) and t.shape[p + 1] > largest:
                        raise invalid_arg(
                            f"input '{t.name}' of model '{model}' has length {t.shape[p + 1]} in dimension "
                            f"{p + 1} of shape {list(t.shape)}, more than the largest pad bucket {largest} "
                            f"(parameter {PAD_BATCHING})"
                        )
            parts.append((t.name, t.datatype, len(t.shape)))
        return tuple(parts)

    return key


def unbatched(request: m.InferRequest) -> tuple[object, ...]:
    return ()
