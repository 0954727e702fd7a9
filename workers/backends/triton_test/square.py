"""``backend: "square"`` (Triton's square_backend), a decoupled model: ``IN`` = [n] gives n
responses, each ``OUT`` = [n], then the final flag alone; ``execute`` returns at once.

The config: one input ``IN`` and one output ``OUT``, both INT32 ``[1]``. ``parameters`` (each a
string of digits; anything else is ignored, as in Triton) simulate compute and failures:

* ``CUSTOM_INFER_DELAY_NS``: each response waits this long before it is computed,
* ``CUSTOM_OUTPUT_DELAY_NS``: and this long more while its output is produced,
* ``CUSTOM_CANCEL_DELAY_NS``: once the request is cancelled, this long before it ends CANCELLED,
* ``CUSTOM_FAIL_COUNT`` (F), ``CUSTOM_EMPTY_COUNT`` (E): of the n responses, those at
  [n-E-F, n-E) fail ("simulated failure") and the last E send nothing.

Triton's response statistics follow the model's own timing: ``compute_infer`` the infer delay,
``compute_output`` the output delay (``ResponseChannel.send``'s ``output_ns``). Unlike Triton, of
the E empty responses only the last is counted, as the final flag (which Triton counts as none).
"""

from __future__ import annotations

import time

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status, invalid_arg
from conveyor.workers.backends.base import AnsweredLater, RequestItem, RequestOutcome
from conveyor.workers.backends.triton_test.replies import Replies
from conveyor.workers.backends.triton_test.settings import need, parameter, shape_text, type_name
from conveyor.workers.backends.triton_test.timeline import Schedule, Timeline

_PARAMETERS = ("CUSTOM_INFER_DELAY_NS", "CUSTOM_OUTPUT_DELAY_NS", "CUSTOM_CANCEL_DELAY_NS",
               "CUSTOM_FAIL_COUNT", "CUSTOM_EMPTY_COUNT")


class SquareBackend:
    def __init__(self, config: mc.ModelConfig, instance_name: str = "") -> None:
        _validate(config)
        self._decoupled = config.model_transaction_policy.decoupled
        values = {}
        for key in _PARAMETERS:
            text = parameter(config, key)
            values[key] = int(text) if text and text.isdigit() else 0  # Triton's IsNumber: digits only
        self._infer_s = values["CUSTOM_INFER_DELAY_NS"] / 1e9
        self._output_s = values["CUSTOM_OUTPUT_DELAY_NS"] / 1e9
        self._cancel_s = values["CUSTOM_CANCEL_DELAY_NS"] / 1e9
        self._fail = values["CUSTOM_FAIL_COUNT"]
        self._empty = values["CUSTOM_EMPTY_COUNT"]
        self._timeline = Timeline(instance_name or config.name)

    def execute_requests(self, items: list[RequestItem]) -> list[RequestOutcome]:
        outcomes: list[RequestOutcome] = []
        for item in items:
            values = item.inputs["IN"]
            if values.ndim == 2 and values.shape[0] != 1:
                error = invalid_arg("unexpected shape for IN input")
                if self._decoupled and item.channel is not None:
                    item.channel.send(error, True)
                outcomes.append(error)
                continue
            count = max(0, int(values.reshape(-1)[0]) if values.size else 0)
            replies = Replies(item, self._decoupled)
            self._timeline.start(self._responses(count, values.ndim, replies), replies.fail)
            outcomes.append(AnsweredLater())
        return [] if self._decoupled else outcomes

    def _responses(self, count: int, dims: int, replies: Replies) -> Schedule:
        for e in range(count):
            if replies.cancelled:
                yield self._cancel_s
                replies.fail(ConveyorError(Status.CANCELLED, "cancelled"))
                return
            yield self._infer_s
            if e + self._empty >= count:  # an empty response: nothing is sent (the last is the final flag)
                continue
            started = time.monotonic_ns()
            out = {"OUT": np.full((1,) * dims, count, np.int32)}
            yield self._output_s
            took = time.monotonic_ns() - started
            if e + self._fail + self._empty >= count:
                replies.send(ConveyorError(Status.UNKNOWN, "simulated failure"), took)
            else:
                replies.send(out, took)
        replies.finish()

    def close(self) -> None:
        self._timeline.close()


def _validate(config: mc.ModelConfig) -> None:
    """The C++ backend's checks, in its order and words."""
    need(len(config.input) == 1, f"expected 1 input, got {len(config.input)}")
    need(len(config.output) == 1, f"expected 1 output, got {len(config.output)}")
    inp, out = config.input[0], config.output[0]
    need(inp.name == "IN", f"expected first input tensor name to be IN, got {inp.name}")
    need(out.name == "OUT", f"expected first output tensor name to be OUT, got {out.name}")
    for tensor in (inp, out):
        need(list(tensor.dims) == [1], f"expected {tensor.name} shape to be [1], got {shape_text(list(tensor.dims))}")
    for tensor in (inp, out):
        got = type_name(tensor.data_type)
        need(got == "TYPE_INT32", f"expected {tensor.name} datatype to be INT32, got {got}")
