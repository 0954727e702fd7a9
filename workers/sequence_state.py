"""The worker's side of sequence batching, per model instance: the control
inputs the router asks for (START, END, READY, CORRID), synthesized per
request row, and the implicit state each sequence slot keeps between the
requests of its sequence.

* Control tensors are [1] per row ([rows, 1] for a batching model), from the
  request's ``SequenceStep``; READY is true on every row, since Conveyor runs
  only the rows that hold a request (router/scheduling/sequences.py), unless
  the router asks for Triton's padded batch (``--sequence-slot-padding``,
  ``pad_batch``): each empty slot below the highest one in use is a row of
  zero inputs with READY, START and END false, CORRID 0 and a zeroed state shaped
  as the batch's first request's (Triton's null request: a variable-shaped state may
  have grown past the initial one's shape), and its outputs are dropped (``unpad``); a request
  backend (Python) gets a not-ready request of zeros in each empty slot
  (``pad_requests``), and its answers go nowhere. Decoupled models are not
  padded.
* State: a START request (or a slot without state) is fed the initial state —
  ``initial_state`` zeros (empty strings for TYPE_STRING) or its ``data_file``, else zeros shaped as the state's
  dims with 1 for each variable dimension. After the run, the model's
  ``output_name`` tensor becomes the slot's state for the next request. The
  state is dropped once the END request ran, or when the router says the
  sequence idled out (``forget``).

Only the instance's own thread touches this object.
"""

from __future__ import annotations

import os
from itertools import pairwise
from typing import Any

import numpy as np

from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.datatypes import deserialize_bytes, numpy_dtype
from conveyor.proto.errors import ConveyorError, internal, invalid_arg, unavailable
from conveyor.proto.repository_files import read_bytes
from conveyor.proto.sequence_config import FlagControl, SequenceConfig, StateSpec
from conveyor.workers.backends.base import RequestItem, RequestOutcome

INITIAL_STATE_DIR = "initial_state"  # Triton's folder for data_file, under the model directory
# An empty slot's row in a padded batch: not ready, not START nor END, CORRID 0, the initial state.
NULL_STEP = m.SequenceStep(-1, False, False, 0)


class SequenceSlots:
    def __init__(self, config: mc.ModelConfig, model_dir: str) -> None:
        seq = SequenceConfig.from_config(config)
        self.batched = config.max_batch_size > 0
        self.flags = [
            (control, pick) for control, pick in (
                (seq.start, _is_start), (seq.end, _is_end), (seq.ready, _is_ready),
            ) if control is not None
        ]
        self.corrid = (seq.corrid_name, numpy_dtype(seq.corrid_datatype)) if seq.corrid_name else None
        self.states = seq.states
        self.state_outputs = [s.output_name for s in seq.states]
        self.initial = {s.input_name: self._initial(s, model_dir) for s in seq.states}
        self.slots: dict[int, dict[str, np.ndarray]] = {}  # slot -> state input name -> array

    def _initial(self, spec: StateSpec, model_dir: str) -> np.ndarray:
        dtype = numpy_dtype(spec.datatype)
        shape = ((1,) if self.batched else ()) + spec.initial_dims
        strings = dtype.kind == "O"  # TYPE_STRING: Triton's zero state is empty strings
        if not spec.data_file:
            return np.full(shape, b"", np.object_) if strings else np.zeros(shape, dtype)
        path = os.path.join(model_dir, INITIAL_STATE_DIR, spec.data_file)
        try:
            data = read_bytes(path, limit=None)  # never a FIFO's wait, nor a device's endless read
        except OSError as exc:
            raise unavailable(f"initial_state data_file for state '{spec.input_name}': {exc}") from None
        count = int(np.prod(shape, dtype=np.int64))
        if strings:  # the file holds the elements length-prefixed, as a request's BYTES tensor
            try:
                return deserialize_bytes(data, count).reshape(shape)
            except ConveyorError as exc:
                raise unavailable(f"initial_state data_file for state '{spec.input_name}': {exc.message}") from None
        need = count * dtype.itemsize
        if len(data) < need:
            raise unavailable(
                f"initial_state setting expects {need} bytes, but the data provided from {spec.data_file} "
                f"only has {len(data)} bytes."
            )
        return np.frombuffer(data[:need], dtype).reshape(shape).copy()

    # --- array backends: one call on the batch's rows --------------------------------------

    def pad_batch(self, inputs: dict[str, Any], items: list[m.BatchItem], rows: int) -> list[int] | None:
        """Spread the batch's rows over ``rows`` rows, each item at its slot's row, zeros in the others (Triton's
        null requests). Returns the items' rows; None (the batch runs as it is) where a batch cannot be padded:
        a model without batching, inputs that are not one host array row per item, slots out of order."""
        if not self.batched or rows <= len(items):
            return None
        slots = [_step(item).slot for item in items]
        if any(b <= a for a, b in pairwise(slots)) or not 0 <= slots[0] or slots[-1] >= rows:
            return None
        for arr in inputs.values():
            if type(arr) is not np.ndarray or arr.ndim == 0 or arr.shape[0] != len(items):
                return None
        for name, arr in list(inputs.items()):
            full = np.zeros((rows, *arr.shape[1:]), arr.dtype) if arr.dtype.kind != "O" else \
                np.full((rows, *arr.shape[1:]), b"", dtype=np.object_)
            full[slots] = arr
            inputs[name] = full
        return slots

    @staticmethod
    def unpad(outputs: dict[str, Any], slots: list[int], rows: int) -> dict[str, Any]:
        """The items' rows of a padded batch's outputs."""
        return {name: arr[slots] if type(arr) is np.ndarray and arr.ndim and arr.shape[0] == rows else arr
                for name, arr in outputs.items()}

    def add_batch_inputs(self, inputs: dict[str, Any], items: list[m.BatchItem], slots: list[int] | None = None,
                         rows: int = 0) -> None:
        """Add the control and state inputs of a batch, one row per item, in order; with ``slots`` (a padded
        batch of ``rows`` rows) each item at its slot's row, a not-ready row in the others."""
        steps = [_step(item) for item in items]
        if slots is not None:
            padded = [NULL_STEP] * rows
            for slot, step in zip(slots, steps, strict=True):
                padded[slot] = step
            steps = padded
        shape = (len(steps), 1) if self.batched else (1,)
        for control, pick in self.flags:
            inputs[control.name] = _flag_tensor(control, [pick(s) for s in steps], shape)
        if self.corrid is not None:
            inputs[self.corrid[0]] = self._corrid_tensor(steps, shape)
        first = next(step for step in steps if step is not NULL_STEP) if slots is not None else None
        for spec in self.states:
            arrays = [self._state(step, spec.input_name) for step in steps]
            if first is not None:  # Triton's null request: a zeroed copy of the batch's first request's state
                model = self._state(first, spec.input_name)
                null = np.zeros_like(model) if model.dtype.kind != "O" else np.full(model.shape, b"", np.object_)
                arrays = [null if step is NULL_STEP else a for step, a in zip(steps, arrays, strict=True)]
            if len(arrays) == 1:
                inputs[spec.input_name] = arrays[0]
            elif any(a.shape != arrays[0].shape for a in arrays):
                raise invalid_arg(
                    f"state '{spec.input_name}' has different shapes across the sequences of one batch: "
                    f"{sorted({a.shape for a in arrays})}"
                )
            else:
                inputs[spec.input_name] = np.concatenate(arrays, axis=0)

    def wanted(self, outputs: list[str]) -> list[str]:
        """The outputs to ask the backend for: the client's plus the state outputs."""
        return sorted({*outputs, *self.state_outputs})

    def keep_batch_states(self, items: list[m.BatchItem], outputs: dict[str, Any]) -> None:
        """Each row's state outputs become its slot's state; END slots let theirs go."""
        for row, item in enumerate(items):
            step = _step(item)
            if step.end:
                self.slots.pop(step.slot, None)
                continue
            kept: dict[str, np.ndarray] = {}
            for spec in self.states:
                out = outputs.get(spec.output_name)
                if out is None:
                    raise internal(f"the model did not produce state output '{spec.output_name}'")
                # A copy: a view would keep the whole batch's output alive.
                kept[spec.input_name] = np.array(out[row : row + 1] if self.batched else out)
            if kept:
                self.slots[step.slot] = kept

    # --- request backends: one request at a time -------------------------------------------

    def add_request_inputs(self, requests: list[RequestItem], items: list[m.BatchItem]) -> None:
        for request, item in zip(requests, items, strict=True):
            request.sequence = step = _step(item)
            self._request_controls(request, step)

    def _request_controls(self, request: RequestItem, step: m.SequenceStep) -> None:
        shape = (1, 1) if self.batched else (1,)
        for control, pick in self.flags:
            request.inputs[control.name] = _flag_tensor(control, [pick(step)], shape)
        if self.corrid is not None:
            request.inputs[self.corrid[0]] = self._corrid_tensor([step], shape)
        for spec in self.states:
            request.inputs[spec.input_name] = self._state(step, spec.input_name)

    def pad_requests(self, requests: list[RequestItem], items: list[m.BatchItem],
                     rows: int) -> tuple[list[RequestItem], list[int]] | None:
        """A padded batch for a request backend (``pad_batch``'s, one request per row): a not-ready request, the
        first request's inputs as zeros, in each empty slot's row; and the items' rows. None: nothing to pad, or
        inputs that are not host arrays. ``add_request_inputs`` has run on ``requests``."""
        if not self.batched or rows <= len(items) or not requests:
            return None
        slots = [_step(item).slot for item in items]
        if any(b <= a for a, b in pairwise(slots)) or not 0 <= slots[0] or slots[-1] >= rows:
            return None
        first = requests[0]
        if any(type(a) is not np.ndarray for a in first.inputs.values()):
            return None
        at = dict(zip(slots, requests, strict=True))
        full = []
        for row in range(rows):
            request = at.get(row)
            if request is None:
                request = RequestItem("", {name: np.zeros_like(a) if a.dtype.kind != "O" else np.full(a.shape, b"",
                                                                                                      np.object_)
                                           for name, a in first.inputs.items()}, list(first.outputs), {})
                self._request_controls(request, NULL_STEP)
            full.append(request)
        return full, slots

    def keep_request_states(self, items: list[m.BatchItem], outcomes: list[RequestOutcome]) -> None:
        """A decoupled model returns no outcomes (it answers through its streams): its END slots still
        let their state go."""
        for i, item in enumerate(items):
            step = _step(item)
            outcome = outcomes[i] if i < len(outcomes) else None
            if step.end:
                self.slots.pop(step.slot, None)
            elif isinstance(outcome, dict) and self.states:
                kept = {}
                for spec in self.states:
                    out = outcome.get(spec.output_name)
                    if out is not None:
                        kept[spec.input_name] = np.array(out)
                if kept:
                    self.slots[step.slot] = kept

    # --- shared ------------------------------------------------------------------------------

    def forget(self, slots: list[int]) -> None:
        """The router ended these slots' sequences (idle timeout)."""
        for slot in slots:
            self.slots.pop(slot, None)

    def _state(self, step: m.SequenceStep, name: str) -> np.ndarray:
        held = None if step.start else self.slots.get(step.slot)
        return self.initial[name] if held is None else held[name]

    def _corrid_tensor(self, steps: list[m.SequenceStep], shape: tuple[int, ...]) -> np.ndarray:
        assert self.corrid is not None
        dtype = self.corrid[1]
        if dtype.kind == "O":  # STRING: the id's bytes (an integer id as its digits)
            ids = [str(s.correlation_id).encode() if s is not NULL_STEP else b"" for s in steps]
            return np.array(ids, dtype=np.object_).reshape(shape)
        return np.array([s.correlation_id for s in steps], dtype=dtype).reshape(shape)


def _step(item: m.BatchItem) -> m.SequenceStep:
    if item.sequence is None:
        raise internal("a request of a sequence-batching model came without its sequence step")
    return item.sequence


def _is_start(step: m.SequenceStep) -> bool:
    return step.start


def _is_end(step: m.SequenceStep) -> bool:
    return step.end


def _is_ready(step: m.SequenceStep) -> bool:
    return step is not NULL_STEP


def _flag_tensor(control: FlagControl, flags: list[bool], shape: tuple[int, ...]) -> np.ndarray:
    values = [control.true if f else control.false for f in flags]
    return np.array(values, dtype=numpy_dtype(control.datatype)).reshape(shape)
