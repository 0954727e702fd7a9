"""``backend: "sequence"`` (Triton's src/test/sequence): an INT32 accumulator per sequence slot.

A request with READY true adds its ``INPUT`` elements to its slot's accumulator (START sets it to
the first element, then adds the rest) and answers ``OUTPUT``, shaped as ``INPUT``, every element
the accumulator; READY false leaves it and answers no output.

The config: ``sequence_batching`` with exactly the control inputs ``START`` and ``READY``; one
input ``INPUT`` and one output ``OUTPUT``, INT32 vectors of the same length (any length);
``parameters`` ``execute_delay_ms``: each execution sleeps that long first. CPU instances only.

Triton's backend keeps an accumulator per row of the batch, which its direct scheduler binds to a
sequence slot; Conveyor's batches hold no empty rows, so the accumulators are kept per slot.
"""

from __future__ import annotations

import time

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status, internal, invalid_arg
from conveyor.workers.backends.base import RequestItem, RequestOutcome
from conveyor.workers.backends.triton_test.settings import int_parameter, need

_CONTROLS = "'START' and 'READY' must be configured as the control inputs"


class SequenceBackend:
    """``sequence`` itself; ``dyna_sequence`` (``dyna_sequence.py``) is this with its own keys."""

    backend = "sequence"

    def __init__(self, config: mc.ModelConfig, device: str = "cpu") -> None:
        self._delay_s = int_parameter(config, "execute_delay_ms") / 1000
        self._validate(config)
        check_io(config)
        if device.startswith("cuda"):
            raise invalid_arg(f"'{self.backend}' backend only supports CPU instances")
        self._batched = config.max_batch_size > 0
        self._decoupled = config.model_transaction_policy.decoupled
        self.accumulators: dict[int | str, int] = {}

    def _validate(self, config: mc.ModelConfig) -> None:
        need(config.HasField("sequence_batching"), _CONTROLS)
        names = [c.name for c in config.sequence_batching.control_input]
        need(len(names) == 2 and sorted(names) == ["READY", "START"], _CONTROLS)

    def execute_requests(self, items: list[RequestItem]) -> list[RequestOutcome]:
        if self._delay_s > 0:
            time.sleep(self._delay_s)
        outcomes = [self._one(item) for item in items]
        if not self._decoupled:
            return outcomes
        for item, outcome in zip(items, outcomes, strict=True):
            if item.channel is not None:
                item.channel.send(outcome, True)
        return []

    def _one(self, item: RequestItem) -> RequestOutcome:
        values = item.inputs["INPUT"]
        if self._batched and values.ndim and values.shape[0] != 1:
            return ConveyorError(Status.UNSUPPORTED, "unable to execute more than one timestep at a time")
        if not flag(item, "READY"):
            return {}
        try:
            key = self.key(item)
        except ConveyorError as exc:
            return exc
        elements = values.reshape(-1).tolist()
        total = 0 if flag(item, "START") else self.accumulators.get(key, 0)
        total = int32(total + sum(elements))
        total = self.finish(item, key, total)
        return {"OUTPUT": np.full(values.shape, total, np.int32)}

    def key(self, item: RequestItem) -> int | str:
        """Whose accumulator: the request's sequence slot."""
        if item.sequence is None:
            raise internal("a request of a sequence model came without its sequence step")
        return item.sequence.slot

    def finish(self, item: RequestItem, key: int | str, total: int) -> int:
        """The accumulator after the request (kept for the slot's next one); what it answers."""
        self.accumulators[key] = total
        return total

    def close(self) -> None:
        self.accumulators.clear()


def check_io(config: mc.ModelConfig) -> None:
    """The INPUT / OUTPUT checks both sequence backends make, in their order and words."""
    need(len(config.input) == 1, "model must have input 'INPUT' with vector shape, any length")
    inp = config.input[0]
    need(len(inp.dims) == 1, "model must have one input 'INPUT' with vector shape, any length")
    need(inp.data_type == mc.TYPE_INT32, "model input must have TYPE_INT32 data-type")
    need(inp.name == "INPUT", "model input must be named 'INPUT'")
    need(len(config.output) == 1, "model must have one output 'OUTPUT' with vector shape, any length")
    out = config.output[0]
    need(len(out.dims) == 1 and out.dims[0] == inp.dims[0],
         "model must have output 'OUTPUT' with shape matching 'INPUT'")
    need(out.data_type == mc.TYPE_INT32, "model output must have TYPE_INT32 data-type")
    need(out.name == "OUTPUT", "model output must be named 'OUTPUT'")


def flag(item: RequestItem, name: str) -> bool:
    """A control input's value (whatever its datatype: zero is false)."""
    control = item.inputs.get(name)
    return control is not None and bool(control.reshape(-1)[0])


def int32(value: int) -> int:
    """``value`` wrapped to INT32, as the C++ accumulator's arithmetic wraps."""
    return (value + 2**31) % 2**32 - 2**31
