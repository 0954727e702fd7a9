"""Turning a batch of descriptors into backend inputs, and outputs back into
shared memory.

Inputs are numpy views of the ingress's arena (no copy) when the batch holds one
request; for an array backend several requests are concatenated (the one copy
batching needs), a request backend gets each request's own views.
Outputs of the whole batch go into one block of this worker's arena, with one
release flag per request.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.datatypes import (
    config_to_datatype,
    datatype_of,
    deserialize_bytes,
    element_count,
    numpy_dtype,
    serialize_bytes,
)
from conveyor.proto.errors import ConveyorError, Status, internal
from conveyor.shm.arena import Arena
from conveyor.shm.regions import RegionCache
from conveyor.workers.backends.base import RequestItem, RequestOutcome
from conveyor.workers.classification import classify


def tensor_view(ref: m.TensorRef, regions: RegionCache) -> np.ndarray:
    raw = regions.view(ref.region, ref.offset, ref.nbytes)
    if ref.datatype == "BYTES":
        return deserialize_bytes(raw.data, element_count(ref.shape)).reshape(ref.shape)
    return raw.view(numpy_dtype(ref.datatype)).reshape(ref.shape)


def gather_inputs(
    items: list[m.BatchItem], regions: RegionCache, config: mc.ModelConfig
) -> tuple[dict[str, np.ndarray], list[int]]:
    """The batch's inputs by name, and the rows each item contributes."""
    batched = config.max_batch_size > 0
    reshape = {i.name: list(i.reshape.shape) for i in config.input if i.HasField("reshape")}
    per_name: dict[str, list[np.ndarray]] = {}
    rows: list[int] = []
    for item in items:
        for ref in item.inputs:
            per_name.setdefault(ref.name, []).append(tensor_view(ref, regions))
        rows.append(item.inputs[0].shape[0] if batched and item.inputs and item.inputs[0].shape else 1)
    inputs: dict[str, np.ndarray] = {}
    for name, arrays in per_name.items():
        arr = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
        if name in reshape:
            arr = arr.reshape(([arr.shape[0]] if batched else []) + reshape[name])
        inputs[name] = arr
    return inputs, rows


def gather_requests(items: list[m.BatchItem], regions: RegionCache, config: mc.ModelConfig) -> list[RequestItem]:
    """Each request's own inputs (views, not concatenated), for a ``RequestBackend``."""
    batched = config.max_batch_size > 0
    reshape = {i.name: list(i.reshape.shape) for i in config.input if i.HasField("reshape")}
    requests: list[RequestItem] = []
    for item in items:
        inputs: dict[str, np.ndarray] = {}
        for ref in item.inputs:
            arr = tensor_view(ref, regions)
            if ref.name in reshape:
                arr = arr.reshape(([arr.shape[0]] if batched else []) + reshape[ref.name])
            inputs[ref.name] = arr
        requests.append(RequestItem(item.request_id, inputs, [o.name for o in item.outputs], item.parameters))
    return requests


# One output of one request, ready to copy: (name, datatype, shape, bytes-like).
PlannedOutput = tuple[str, str, list[int], np.ndarray | bytes]


def _plan_output(
    spec: m.OutputSpec, part: np.ndarray, datatype: str, labels: dict[str, list[str]], batched: bool
) -> PlannedOutput:
    if spec.classification > 0:
        cls = classify(part, spec.classification, labels.get(spec.name), batched)
        return (spec.name, "BYTES", list(cls.shape), serialize_bytes(cls))
    if datatype == "BYTES":
        return (spec.name, datatype, list(part.shape), serialize_bytes(part))
    arr = np.ascontiguousarray(part, dtype=numpy_dtype(datatype))
    return (spec.name, datatype, list(arr.shape), arr)


def plan_batch_outputs(
    items: list[m.BatchItem],
    rows: list[int],
    outputs: dict[str, np.ndarray],
    config: mc.ModelConfig,
    labels: dict[str, list[str]],
) -> list[list[PlannedOutput]]:
    """Split a batched call's outputs back into each request's rows."""
    batched = config.max_batch_size > 0
    declared = {o.name: o for o in config.output}
    planned: list[list[PlannedOutput]] = []
    start = 0
    for item, n in zip(items, rows, strict=True):
        mine: list[PlannedOutput] = []
        for spec in item.outputs:
            full = outputs.get(spec.name)
            if full is None:
                raise internal(f"the model did not produce output '{spec.name}'")
            part = full[start : start + n] if batched else full
            out_cfg = declared.get(spec.name)
            if out_cfg is not None and out_cfg.HasField("reshape"):
                part = part.reshape(([n] if batched else []) + list(out_cfg.dims))
            dt = config_to_datatype(mc.DataType.Name(out_cfg.data_type)) if out_cfg else "FP32"
            mine.append(_plan_output(spec, part, dt, labels, batched))
        planned.append(mine)
        start += n
    return planned


def plan_request_outputs(
    items: list[m.BatchItem], outcomes: list[RequestOutcome], config: mc.ModelConfig, labels: dict[str, list[str]]
) -> list[list[PlannedOutput] | ConveyorError]:
    """Each request's outcome from a ``RequestBackend``: the requested outputs it
    produced, in the datatype it produced them in (as Triton's Python backend
    does), or its error."""
    if len(outcomes) != len(items):
        raise internal(f"the backend returned {len(outcomes)} outcomes for {len(items)} requests")
    batched = config.max_batch_size > 0
    planned: list[list[PlannedOutput] | ConveyorError] = []
    for item, outcome in zip(items, outcomes, strict=True):
        if isinstance(outcome, ConveyorError):
            planned.append(outcome)
            continue
        mine: list[PlannedOutput] = []
        try:
            for spec in item.outputs:
                array = outcome.get(spec.name)
                if array is not None:  # an output the model did not produce is left out, as in Triton
                    array = np.asarray(array)
                    mine.append(_plan_output(spec, array, datatype_of(array), labels, batched))
        except ConveyorError as exc:  # e.g. a dtype no datatype matches: only this request fails
            planned.append(ConveyorError(Status.INTERNAL, f"output '{spec.name}' of the model: {exc.message}"))
            continue
        planned.append(mine)
    return planned


class OutputWriter:
    """Writes outputs into this worker's arena; the arena is shared by instance
    threads, so allocation is locked (the copies are not)."""

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self.lock = threading.Lock()

    def write(self, planned: Sequence[list[PlannedOutput] | ConveyorError]) -> list[m.ItemResult]:
        """One block for the whole batch, one release flag per request."""
        total = sum(_nbytes(t[3]) for mine in planned if not isinstance(mine, ConveyorError) for t in mine)
        with self.lock:
            payload, flags = self.arena.alloc_released(total, len(planned))
        results: list[m.ItemResult] = []
        offset = payload
        arena = self.arena
        for i, mine in enumerate(planned):
            if isinstance(mine, ConveyorError):
                arena.array[flags + i] = 1  # nothing of this block goes to that request
                results.append(m.ItemResult(i, error=m.ErrorInfo(int(mine.status), mine.message)))
                continue
            refs = []
            for name, dt, shape, data in mine:
                nbytes = _nbytes(data)
                dst = arena.array[offset : offset + nbytes]
                if isinstance(data, np.ndarray):
                    dst[:] = data.reshape(-1).view(np.uint8)
                else:
                    dst[:] = np.frombuffer(data, dtype=np.uint8)
                refs.append(m.TensorRef(name, dt, shape, arena.name, offset, nbytes))
                offset += nbytes
            results.append(m.ItemResult(i, refs, release=[m.Release(arena.name, flags + i)]))
        return results


def _nbytes(data: np.ndarray | bytes) -> int:
    return data.nbytes if isinstance(data, np.ndarray) else len(data)
