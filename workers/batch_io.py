"""Turning a batch of descriptors into backend inputs, and outputs back into
shared memory.

Inputs are numpy views of the ingress's arena or of a client-registered region
(no copy) when the batch holds one request; for an array backend several
requests are concatenated (the one copy batching needs), a request backend gets
each request's own views. Outputs a client placed in its own region are written
there in place; the rest of the batch's outputs go into one block of this
worker's arena, with one release flag per request.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.datatypes import (
    DATATYPES,
    config_to_datatype,
    datatype_of,
    deserialize_bytes,
    element_count,
    numpy_dtype,
    serialize_bytes,
)
from conveyor.proto.errors import ConveyorError, Status, internal, invalid_arg
from conveyor.shm.arena import RELEASED, Arena
from conveyor.shm.regions import RegionCache
from conveyor.workers.backends.base import RequestItem, RequestOutcome, WireTensor
from conveyor.workers.batch_layout import BatchLayout, concatenate
from conveyor.workers.classification import classify, label_file
from conveyor.workers.client_regions import PREFIX, ClientRegionMaps, is_client_region, is_device_array

# The fixed-size datatypes' numpy dtypes, and back (native byte order): the hot paths' one dict lookup
# instead of ``numpy_dtype``/``datatype_of`` and their checks. BYTES is in neither: it has its own path.
_DTYPE_OF: dict[str, np.dtype] = {name: numpy_dtype(name) for name in DATATYPES if name != "BYTES"}
_DATATYPE_OF: dict[np.dtype, str] = {
    dt: name for name, dt in _DTYPE_OF.items() if name != "BF16" and datatype_of(np.empty(0, dt)) == name
}


@dataclass(frozen=True, slots=True)
class IoPlan:
    """What a model's config says about moving its tensors, worked out once at load
    instead of on every batch."""

    batched: bool
    reshape: dict[str, list[int]]  # input name -> the shape the model takes it in (``reshape``)
    out_datatype: dict[str, str]  # declared output -> its KServe datatype
    out_reshape: dict[str, list[int]]  # declared output with a ``reshape`` -> its ``dims``
    outputs_sorted: tuple[str, ...]  # every declared output, in the order array backends get them
    labels: dict[str, list[str]]  # output -> its classification labels

    @classmethod
    def from_config(cls, config: mc.ModelConfig, labels: dict[str, list[str]]) -> IoPlan:
        return cls(
            batched=config.max_batch_size > 0,
            reshape={i.name: list(i.reshape.shape) for i in config.input if i.HasField("reshape")},
            out_datatype={o.name: config_to_datatype(mc.DataType.Name(o.data_type)) for o in config.output},
            out_reshape={o.name: list(o.dims) for o in config.output if o.HasField("reshape")},
            outputs_sorted=tuple(sorted(o.name for o in config.output)),
            labels=labels,
        )

    def wanted(self, items: list[m.BatchItem]) -> list[str]:
        """The outputs a batch asks for, sorted (each name once)."""
        names = {o.name for item in items for o in item.outputs}
        if names.issubset(self.out_datatype):
            return [n for n in self.outputs_sorted if n in names]
        return sorted(names)


class TensorViews:
    """Resolves a ``TensorRef`` to an array over the bytes where they lie: a server
    arena (``RegionCache``) or a client-registered region (``ClientRegionMaps``)."""

    def __init__(self, arenas: RegionCache, clients: ClientRegionMaps) -> None:
        self.arenas = arenas
        self.clients = clients
        self._mapped = arenas.mapped

    def raw(self, region: str, offset: int, nbytes: int, *, writable: bool = False) -> Any:
        if is_client_region(region):
            return self.clients.view(region, offset, nbytes, writable=writable)
        return self.arenas.view(region, offset, nbytes)

    def tensor(self, ref: m.TensorRef) -> Any:
        region = ref.region
        dtype = _DTYPE_OF.get(ref.datatype)
        if dtype is not None and not region.startswith(PREFIX):
            # A server arena's tensor of a fixed-size datatype (nearly every input): one array made over the
            # segment, with the same checks, in the same order, as the general path below.
            base = self._mapped.get(region)
            if base is None:
                base = self.arenas.array(region)
            offset, nbytes, shape = ref.offset, ref.nbytes, ref.shape
            if offset < 0 or nbytes < 0 or offset + nbytes > base.shape[0]:
                self.arenas.view(region, offset, nbytes)  # raises its error
            if nbytes != math.prod(shape) * dtype.itemsize:
                raise invalid_arg(
                    f"input '{ref.name}': {nbytes} bytes do not hold shape {shape} of {ref.datatype}"
                )
            return np.ndarray(shape, dtype, base, offset)
        raw = self.raw(region, ref.offset, ref.nbytes)
        if ref.datatype == "BYTES":
            if is_device_array(raw):
                raise invalid_arg(f"input '{ref.name}': BYTES tensors cannot be passed in CUDA shared memory")
            return deserialize_bytes(raw.data, element_count(ref.shape)).reshape(ref.shape)
        dtype = numpy_dtype(ref.datatype)
        if ref.nbytes != element_count(ref.shape) * dtype.itemsize:
            raise invalid_arg(
                f"input '{ref.name}': {ref.nbytes} bytes do not hold shape {ref.shape} of {ref.datatype}"
            )
        return raw.view(dtype).reshape(ref.shape)


def gather_inputs(
    items: list[m.BatchItem], views: TensorViews, plan: IoPlan, layout: BatchLayout | None = None
) -> tuple[dict[str, Any], list[int]]:
    """The batch's inputs by name, and the rows each item contributes. ``layout``: the
    model batches requests of different shapes (ragged inputs, padding, batch inputs)."""
    batched = plan.batched
    reshape = plan.reshape
    per_name: dict[str, list[Any]] = {}
    rows: list[int] = []
    for item in items:
        for ref in item.inputs:
            per_name.setdefault(ref.name, []).append(views.tensor(ref))
        rows.append(item.inputs[0].shape[0] if batched and item.inputs and item.inputs[0].shape else 1)
    if layout is not None:
        inputs = layout.assemble(per_name, len(items))
        ragged = layout.shapes.ragged
    else:
        inputs = {name: arrays[0] if len(arrays) == 1 else concatenate(arrays) for name, arrays in per_name.items()}
        ragged = frozenset()
    for name, shape in reshape.items():
        arr = inputs.get(name)
        if arr is not None and name not in ragged:  # a ragged input is 1-D whatever its reshape
            inputs[name] = arr.reshape(([arr.shape[0]] if batched else []) + shape)
    return inputs, rows


def gather_requests(items: list[m.BatchItem], views: TensorViews, plan: IoPlan) -> list[RequestItem]:
    """Each request's own inputs (host views, not concatenated), for a ``RequestBackend``."""
    batched = plan.batched
    reshape = plan.reshape
    requests: list[RequestItem] = []
    for item in items:
        inputs: dict[str, np.ndarray] = {}
        for ref in item.inputs:
            arr = views.tensor(ref)
            if type(arr) is not np.ndarray:
                arr = to_host(arr)
            name = ref.name
            if reshape and name in reshape:
                arr = arr.reshape(([arr.shape[0]] if batched else []) + reshape[name])
            inputs[name] = arr
        requests.append(RequestItem(item.request_id, inputs, [o.name for o in item.outputs], item.parameters))
    return requests


def to_host(arr: Any) -> np.ndarray:
    """A numpy array of ``arr`` (a device array is copied to the host)."""
    return arr.get() if is_device_array(arr) else np.asarray(arr)


def host_inputs(inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """For backends that take host arrays only: device inputs cross to the host here."""
    return {k: to_host(v) if is_device_array(v) else v for k, v in inputs.items()}


def copy_into(dst: Any, src: Any) -> None:
    """Copy the C-contiguous bytes of ``src`` into the uint8 array ``dst`` (host or device)."""
    if is_device_array(dst):
        import cupy

        dst[:] = cupy.ascontiguousarray(cupy.asarray(src)).reshape(-1).view(cupy.uint8)
        return
    src = to_host(src)
    if src.flags.c_contiguous:
        dst[:] = src.reshape(-1).view(np.uint8)
    else:  # e.g. a request's output cut out of a padded batch: gathered straight into place
        np.copyto(dst.view(src.dtype).reshape(src.shape), src)


# One output of one request, ready to copy: (spec, datatype, shape, bytes or array).
PlannedOutput = tuple[m.OutputSpec, str, list[int], Any]


def _plan_output(
    spec: m.OutputSpec, part: Any, datatype: str, labels: dict[str, list[str]], batched: bool
) -> PlannedOutput:
    if spec.classification > 0:
        named = label_file(spec.labels_path) if spec.labels_path else labels.get(spec.name)
        cls = classify(to_host(part), spec.classification, named, batched, datatype)
        return (spec, "BYTES", list(cls.shape), serialize_bytes(cls))
    if datatype == "BYTES":
        return (spec, datatype, list(part.shape), serialize_bytes(to_host(part)))
    if is_device_array(part):
        # Stays on the device until it is copied into its destination.
        return (spec, datatype, list(part.shape), part.astype(numpy_dtype(datatype), copy=False))
    # A strided part (cut out of a padded batch) stays a view: copy_into gathers it in its one copy.
    want = numpy_dtype(datatype)
    arr = np.asarray(part)
    if arr.dtype != want:
        arr = arr.astype(want)
    return (spec, datatype, list(arr.shape), arr)


def plan_batch_outputs(
    items: list[m.BatchItem],
    rows: list[int],
    outputs: dict[str, Any],
    plan: IoPlan,
    layout: BatchLayout | None = None,
) -> list[list[PlannedOutput]]:
    """Split a batched call's outputs back into each request's rows (``layout``: scatter
    outputs and outputs cut back from padding split its way)."""
    batched = plan.batched
    datatypes, out_reshape, labels = plan.out_datatype, plan.out_reshape, plan.labels
    special: dict[str, list[Any]] = {}
    if layout is not None:
        names = {o.name for item in items for o in item.outputs} & layout.splits
        if names:
            shapes = [{ref.name: ref.shape for ref in item.inputs} for item in items]
            for name in names:
                full = outputs.get(name)
                if full is not None:
                    special[name] = layout.parts(name, full, shapes, rows)
    planned: list[list[PlannedOutput]] = []
    start = 0
    for index, (item, n) in enumerate(zip(items, rows, strict=True)):
        mine: list[PlannedOutput] = []
        for spec in item.outputs:
            full = outputs.get(spec.name)
            if full is None:
                raise internal(f"the model did not produce output '{spec.name}'")
            parts = special.get(spec.name)
            if parts is not None:
                part = parts[index]
            else:
                part = full[start : start + n] if batched else full
                dims = out_reshape.get(spec.name)
                if dims is not None:
                    part = part.reshape(([n] if batched else []) + dims)
            mine.append(_plan_output(spec, part, datatypes.get(spec.name, "FP32"), labels, batched))
        planned.append(mine)
        start += n
    return planned


def plan_request_outputs(
    items: list[m.BatchItem], outcomes: Sequence[RequestOutcome], plan: IoPlan
) -> list[list[PlannedOutput] | ConveyorError]:
    """Each request's outcome from a ``RequestBackend``: the requested outputs it
    produced, in the datatype it produced them in (as Triton's Python backend
    does), or its error."""
    if len(outcomes) != len(items):
        raise internal(f"the backend returned {len(outcomes)} outcomes for {len(items)} requests")
    batched, labels, out_reshape = plan.batched, plan.labels, plan.out_reshape
    planned: list[list[PlannedOutput] | ConveyorError] = []
    for item, outcome in zip(items, outcomes, strict=True):
        if isinstance(outcome, ConveyorError):
            planned.append(outcome)
            continue
        mine: list[PlannedOutput] = []
        try:
            for spec in item.outputs:
                value = outcome.get(spec.name)
                if value is None:  # an output the model did not produce is left out, as in Triton
                    continue
                if out_reshape and spec.name in out_reshape:  # the model's shape back to the config's dims
                    value = _reshaped(value, out_reshape[spec.name], batched)
                if type(value) is np.ndarray and not spec.classification:
                    datatype = _DATATYPE_OF.get(value.dtype)
                    if datatype is not None:  # a number array: what ``_plan_output`` would make of it
                        mine.append((spec, datatype, list(value.shape), value))
                        continue
                if type(value) is WireTensor:
                    if not spec.classification:
                        mine.append((spec, value.datatype, value.shape, value.data))
                        continue
                    value = value.to_numpy()
                array: Any = value if is_device_array(value) else np.asarray(value)  # a Python model's GPU tensor
                mine.append(_plan_output(spec, array, datatype_of(array), labels, batched))
        except ConveyorError as exc:  # e.g. a dtype no datatype matches: only this request fails
            planned.append(ConveyorError(Status.INTERNAL, f"output '{spec.name}' of the model: {exc.message}"))
            continue
        planned.append(mine)
    return planned


def _reshaped(value: Any, dims: list[int], batched: bool) -> Any:
    """An output with ``reshape`` as the client sees it: its ``dims`` behind the request's batch
    size, as Triton's core turns every backend's output back (INVALID_ARG when it cannot)."""
    shape = list(value.shape)
    to = ([shape[0]] if batched and shape else []) + dims
    if type(value) is WireTensor:
        known = math.prod(d for d in to if d != -1)
        count = math.prod(shape)
        if to.count(-1) == 1 and known and count % known == 0:
            to = [count // known if d == -1 else d for d in to]
        if math.prod(to) != count or -1 in to:
            raise invalid_arg(f"output shape {shape} cannot be reshaped to {to}")
        return WireTensor(value.datatype, to, value.data)
    try:
        return value.reshape(to)
    except ValueError:
        raise invalid_arg(f"output shape {shape} cannot be reshaped to {to}") from None


class OutputWriter:
    """Writes outputs into this worker's arena, or in place into client regions;
    the arena is shared by instance threads, so allocation is locked (the copies are not)."""

    def __init__(self, arena: Arena, views: TensorViews) -> None:
        self.arena = arena
        self.views = views
        self.lock = threading.Lock()

    def write(self, planned: Sequence[list[PlannedOutput] | ConveyorError]) -> list[m.ItemResult]:
        """Client-region outputs in place; the rest in one block for the whole batch,
        one release flag per request. A request whose region is too small fails alone."""
        outcomes: list[list[PlannedOutput] | ConveyorError] = []
        placed: dict[int, dict[str, m.TensorRef]] = {}  # request -> its outputs written in client regions
        total = 0  # the bytes of the outputs that go into this worker's arena
        for i, mine in enumerate(planned):
            if not isinstance(mine, ConveyorError):
                size = 0
                try:
                    for spec, dt, shape, data in mine:
                        if spec.region:
                            placed.setdefault(i, {})[spec.name] = self._write_in_place(spec, dt, shape, data)
                        else:
                            size += len(data) if isinstance(data, bytes) else int(data.nbytes)
                    total += size
                except ConveyorError as exc:
                    # A fresh error, without the traceback: its frames would keep this
                    # batch's views of client regions alive until the next GC cycle.
                    mine = ConveyorError(exc.status, exc.message)
            outcomes.append(mine)
        arena = self.arena
        # No block when every output went into a client's region (or failed): no flag to release.
        offset, flags = 0, None
        if total or self._any_in_arena(outcomes):
            with self.lock:
                offset, flags = arena.alloc_released(total, len(outcomes))
        name = arena.name
        results: list[m.ItemResult] = []
        for i, mine in enumerate(outcomes):
            if isinstance(mine, ConveyorError):
                if flags is not None:
                    arena.array[flags + i] = RELEASED  # nothing of this block goes to that request
                results.append(m.ItemResult(i, error=m.ErrorInfo(int(mine.status), mine.message)))
                continue
            out: list[m.TensorRef] = []
            for spec, dt, shape, data in mine:
                if spec.region:
                    out.append(placed[i][spec.name])
                    continue
                if isinstance(data, bytes):
                    nbytes = len(data)
                    arena.put(offset, data)
                else:
                    nbytes = int(data.nbytes)
                    if type(data) is np.ndarray and data.flags.c_contiguous:
                        arena.put_buffer(offset, nbytes, data)  # through the mapping: cheaper for small arrays
                    else:
                        copy_into(arena.array[offset : offset + nbytes], data)
                out.append(m.TensorRef(spec.name, dt, shape, name, offset, nbytes))
                offset += nbytes
            results.append(m.ItemResult(i, out, release=[] if flags is None else [m.Release(name, flags + i)]))
        return results

    @staticmethod
    def _any_in_arena(outcomes: list[list[PlannedOutput] | ConveyorError]) -> bool:
        """Whether an output of 0 bytes goes into the arena (it still takes a block and its flags)."""
        return any(not t[0].region for mine in outcomes if not isinstance(mine, ConveyorError) for t in mine)

    def _write_in_place(self, spec: m.OutputSpec, dt: str, shape: list[int], data: Any) -> m.TensorRef:
        nbytes = _nbytes(data)
        if nbytes > spec.nbytes:
            raise invalid_arg(
                f"shared memory size specified with the request for output '{spec.name}' ({spec.nbytes} bytes) "
                f"should be at least {nbytes} bytes to hold the results"
            )
        dst = self.views.raw(spec.region, spec.offset, nbytes, writable=True)
        if isinstance(data, bytes):
            if is_device_array(dst):
                raise invalid_arg(f"output '{spec.name}': BYTES tensors cannot be placed in CUDA shared memory")
            dst[:] = np.frombuffer(data, dtype=np.uint8)
        else:
            copy_into(dst, data)
        return m.TensorRef(spec.name, dt, shape, spec.region, spec.offset, nbytes)


def _nbytes(data: Any) -> int:
    return len(data) if isinstance(data, bytes) else int(data.nbytes)
