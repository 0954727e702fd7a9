"""Building an array backend's batch from requests whose shapes differ, and
splitting its outputs back (see ``proto/batch_shapes.py`` for the config).

* A ragged input becomes one 1-D tensor: the requests' elements one after
  another (one copy; a batch of one request is a view).
* A padded input becomes ``[rows, *padded dims]``: each request's bytes are
  copied once into its place, and only the padding around them is filled.
  A batch whose requests already have the padded shape is concatenated as usual.
* ``batch_input`` tensors are computed from the shapes the clients sent.
* A ``batch_output`` scatter target hands each request the next elements of the
  model's output; an output that follows a padded input is cut back to each
  request's own length (a view: the one copy into the arena follows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.batch_shapes import BatchInputSpec, BatchShapes, PadSpec, ScatterSpec
from conveyor.proto.datatypes import numpy_dtype
from conveyor.proto.errors import internal, invalid_arg
from conveyor.workers.client_regions import is_device_array

_Kind = mc.BatchInput.Kind
Shape = list[int] | tuple[int, ...]


def batch_input_tensor(kind: int, shapes: list[Shape], datatype: str) -> np.ndarray:
    """Triton's batch input of ``kind`` for requests whose source input has ``shapes``
    (each with its batch dimension, as the client sent it).

    * BATCH_ELEMENT_COUNT: ``[requests]``, each request's element count;
    * BATCH_ACCUMULATED_ELEMENT_COUNT: ``[requests]``, the running sum of those
      (where each request ends in a ragged input);
    * BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO: ``[requests + 1]``, 0 first
      (where each request starts, and the end);
    * BATCH_MAX_ELEMENT_COUNT_AS_SHAPE: ``[max element count]``: the shape is the
      information (zeros; Triton leaves the values undefined);
    * BATCH_ITEM_SHAPE: ``[rows, ndims - 1]``, each row's shape without the batch
      dimension (a request of n rows gives n equal rows);
    * BATCH_ITEM_SHAPE_FLATTEN: the same values, 1-D.
    """
    dtype = numpy_dtype(datatype)
    counts = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    if kind == _Kind.BATCH_ELEMENT_COUNT:
        return np.array(counts, dtype)
    if kind == _Kind.BATCH_ACCUMULATED_ELEMENT_COUNT:
        return np.cumsum(counts, dtype=np.int64).astype(dtype)
    if kind == _Kind.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        return np.concatenate(([0], np.cumsum(counts, dtype=np.int64))).astype(dtype)
    if kind == _Kind.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE:
        return np.zeros(max(counts, default=0), dtype)
    if kind in (_Kind.BATCH_ITEM_SHAPE, _Kind.BATCH_ITEM_SHAPE_FLATTEN):
        ranks = {len(s) for s in shapes}
        if len(ranks) > 1:
            raise invalid_arg(f"{_Kind.Name(kind)}: the batch's requests have shapes of different ranks {shapes}")
        width = ranks.pop() - 1 if ranks else 0
        rows = [list(s[1:]) for s in shapes for _ in range(s[0])]
        out = np.array(rows, dtype).reshape(len(rows), width)
        return out if kind == _Kind.BATCH_ITEM_SHAPE else out.reshape(-1)
    raise internal(f"unknown batch input kind {kind}")


def padded_sizes(spec: PadSpec, shapes: list[Shape], shapes_config: BatchShapes) -> dict[int, int]:
    """Each variable dim (index without the batch dim) of a padded input -> its size in this batch."""
    sizes: dict[int, int] = {}
    for p in spec.positions:
        longest = max(s[1 + p] for s in shapes)
        size = shapes_config.bucket(longest)
        if size < 0:  # the router refuses these on arrival
            raise invalid_arg(f"length {longest} is beyond the largest pad bucket {shapes_config.buckets[-1]}")
        sizes[p] = size
    return sizes


class BatchLayout:
    """One model's batch assembly beyond equal-shape concatenation (``BatchShapes.active``)."""

    def __init__(self, shapes: BatchShapes) -> None:
        self.shapes = shapes
        self.splits = frozenset(shapes.scatter) | frozenset(shapes.follows)

    def assemble(self, per_name: dict[str, list[Any]], count: int) -> dict[str, Any]:
        """The batch's inputs from each input's arrays (in request order; ``count`` requests)."""
        shapes = self.shapes
        inputs: dict[str, Any] = {}
        for name, arrays in per_name.items():
            if name in shapes.ragged:
                flat = [a.reshape(-1) for a in arrays]
                inputs[name] = flat[0] if len(flat) == 1 else concatenate(flat)
            elif name in shapes.padded:
                spec = shapes.padded[name]
                inputs[name] = _pad(arrays, spec, padded_sizes(spec, [a.shape for a in arrays], shapes))
            else:
                inputs[name] = arrays[0] if len(arrays) == 1 else concatenate(arrays)
        for bi in shapes.batch_inputs:
            tensor = batch_input_tensor(bi.kind, _source_shapes(bi, per_name, count), bi.datatype)
            for target in bi.targets:
                inputs[target] = tensor
        return inputs

    def parts(self, name: str, full: Any, shapes: Sequence[Mapping[str, Shape]], rows: list[int]) -> list[Any]:
        """Each request's part of output ``name`` (one of ``splits``)."""
        scatter = self.shapes.scatter.get(name)
        if scatter is not None:
            return _scatter(name, scatter, full, shapes)
        source = self.shapes.follows[name]
        spec = self.shapes.padded[source]
        own = [s.get(source) for s in shapes]
        present = [s for s in own if s is not None]  # an optional input some requests left out
        sizes = padded_sizes(spec, present, self.shapes) if present else {}
        parts: list[Any] = []
        start = 0
        for shape, n in zip(own, rows, strict=True):
            part = full[start : start + n]
            start += n
            if shape is not None:
                cut = [slice(None)] * part.ndim
                for p, size in sizes.items():
                    # Only where the model kept the padded length: any other length is the model's own.
                    if p + 1 < part.ndim and part.shape[p + 1] == size:
                        cut[p + 1] = slice(0, shape[p + 1])
                part = part[tuple(cut)]
            parts.append(part)
        return parts


def _source_shapes(bi: BatchInputSpec, per_name: dict[str, list[Any]], count: int) -> list[Shape]:
    arrays = per_name.get(bi.source, [])
    if len(arrays) != count:
        raise invalid_arg(
            f"batch input '{bi.targets[0]}' is computed from input '{bi.source}': every request must send it"
        )
    return [a.shape for a in arrays]


def _pad(arrays: list[Any], spec: PadSpec, sizes: dict[int, int]) -> Any:
    first = arrays[0]
    target = list(first.shape[1:])
    for p, size in sizes.items():
        target[p] = size
    if all(list(a.shape[1:]) == target for a in arrays):
        return first if len(arrays) == 1 else concatenate(arrays)
    xp, arrays = _array_module(arrays)
    out = xp.empty((sum(a.shape[0] for a in arrays), *target), dtype=arrays[0].dtype)
    start = 0
    for a in arrays:
        n = a.shape[0]
        rows = slice(start, start + n)
        # The padding around this request's block, one slab per padded dim (slabs may overlap: pad only).
        for p in spec.positions:
            if a.shape[p + 1] < target[p]:
                slab = [rows] + [slice(None)] * len(target)
                slab[p + 1] = slice(a.shape[p + 1], None)
                out[tuple(slab)] = spec.value
        out[(rows, *(slice(0, d) for d in a.shape[1:]))] = a
        start += n
    return out


def _scatter(name: str, spec: ScatterSpec, full: Any, shapes: Sequence[Mapping[str, Shape]]) -> list[Any]:
    flat = full.reshape(-1)
    parts: list[Any] = []
    offset = 0
    for own in shapes:
        source = own.get(spec.source)
        if source is None:
            raise invalid_arg(f"output '{name}' is scattered by input '{spec.source}': every request must send it")
        shape = []
        for i, d in enumerate(spec.shape):
            if d == -1:
                if i >= len(source):
                    raise invalid_arg(f"output '{name}' dim {i} follows input '{spec.source}', which has "
                                      f"only {len(source)} dims")
                d = source[i]
            shape.append(int(d))
        count = int(np.prod(shape, dtype=np.int64))
        if offset + count > flat.shape[0]:
            raise internal(
                f"the model's output '{name}' holds {flat.shape[0]} elements, fewer than its batch_output "
                f"scatter needs for the requests' '{spec.source}' shapes"
            )
        parts.append(flat[offset : offset + count].reshape(shape))
        offset += count
    return parts


def _array_module(arrays: list[Any]) -> tuple[Any, list[Any]]:
    """cupy when every array is on the device, else numpy (device arrays copied to the host)."""
    device = [is_device_array(a) for a in arrays]
    if all(device):
        import cupy

        return cupy, arrays
    if any(device):
        arrays = [a.get() if d else a for a, d in zip(arrays, device, strict=True)]
    return np, arrays


def concatenate(arrays: list[Any]) -> Any:
    """Along the batch dimension, on the device when every array is there."""
    xp, arrays = _array_module(arrays)
    return xp.concatenate(arrays, axis=0)
