"""``backend: "implicit_state"`` (Triton's src/test/implicit_state): the backend Triton's
qa/L0_implicit_state tests its backend API for implicit state with. Each request's ``TEST_CASE``
input (INT32 [1]) picks what it does with the sequence's state (``INPUT_STATE`` in,
``OUTPUT_STATE`` out):

* 0: asks for a state named ``undefined_state``: the request fails INVALID_ARG, in Triton's
  words, with "State configuration is missing" when the config has no ``state``, else "is not a
  valid state name".
* 1: ``OUTPUT`` = ``INPUT`` + ``INPUT_STATE``, and the state is left as it was (never updated).
* 2: the state stays in the one buffer the input and output share
  (``use_same_buffer_for_input_output``): nothing is written, no output.
* 3: the state grows by a block of 1 MiB (INT8) per request, the ``i``-th block (``i`` from 0 at
  START) filled with ``i``, and is answered whole as ``OUTPUT_STATE``
  (``use_growable_memory``).

The config: ``sequence_batching`` with three control inputs (``START``, ``END``, ``READY``);
inputs ``INPUT`` and ``TEST_CASE``; ``OUTPUT``. A batching model's request carries one timestep.

Triton's backend also checks the memory each buffer lives in (a state buffer asked for in GPU
memory must be there; a growable one must be GPU memory). Conveyor's implicit state is a host
array in the worker, whatever the instance's kind, so those checks do not apply, and a state
grows as its output grows, growable or not.
"""

from __future__ import annotations

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status
from conveyor.workers.backends.base import RequestItem, RequestOutcome
from conveyor.workers.backends.triton_test.sequence import flag, int32
from conveyor.workers.backends.triton_test.settings import need

_CONTROLS = "'START', 'END, and 'READY' must be configured as the control inputs"  # sic
GROWTH_BLOCK = 1024 * 1024  # test case 3: the bytes (INT8 elements) the state grows by per request, as Triton's


class ImplicitStateBackend:
    backend = "implicit_state"

    def __init__(self, config: mc.ModelConfig) -> None:
        need(config.HasField("sequence_batching"), _CONTROLS)
        names = {c.name for c in config.sequence_batching.control_input}
        need(len(config.sequence_batching.control_input) == 3 and bool(names & {"START", "END", "READY"}),
             _CONTROLS)
        self._model = config.name
        self._batched = config.max_batch_size > 0
        # TRITONBACKEND_StateNew's answer to a state name the config does not declare, made once.
        self._undefined = ConveyorError(
            Status.INVALID_ARG,
            f"unable to add state 'undefined_state'. State configuration is missing for model '{config.name}'."
            if not config.sequence_batching.state else "state 'undefined_state' is not a valid state name.",
        )

    def execute_requests(self, items: list[RequestItem]) -> list[RequestOutcome]:
        return [self._one(item) for item in items]

    def _one(self, item: RequestItem) -> RequestOutcome:
        inputs = item.inputs
        values = inputs.get("INPUT")
        if self._batched and values is not None and values.ndim and values.shape[0] != 1:
            return ConveyorError(Status.UNSUPPORTED, "unable to execute more than one timestep at a time")
        for name in ("START", "END", "READY", "INPUT", "TEST_CASE"):
            if name not in inputs:
                return _unknown(name)
        assert values is not None
        case = int(inputs["TEST_CASE"].reshape(-1)[0])
        if case == 0:
            return self._undefined
        state = inputs.get("INPUT_STATE")
        if state is None:
            return _unknown("INPUT_STATE")
        if case == 1:
            total = int32(int(values.reshape(-1)[0]) + int(state.reshape(-1)[0]))
            return {"OUTPUT": np.full((1,), total, np.int32)}
        if case == 3:
            index = 0 if flag(item, "START") else state.size // GROWTH_BLOCK
            kept = state.reshape(-1)[: index * GROWTH_BLOCK].astype(np.int8, copy=False)
            grown = np.concatenate([kept, np.full(GROWTH_BLOCK, index, np.int8)])
            return {"OUTPUT_STATE": grown}
        return {}  # case 2 (the shared buffer is the state as it is) and any other: no output

    def close(self) -> None:
        pass


def _unknown(name: str) -> ConveyorError:
    """TRITONBACKEND_RequestInput's answer for an input the request does not hold."""
    return ConveyorError(Status.INVALID_ARG, f"unknown request input name {name}")
