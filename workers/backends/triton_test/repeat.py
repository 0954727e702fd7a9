"""``backend: "repeat"`` (Triton's repeat_backend), a decoupled model: for each element ``e`` of
``IN`` it waits ``DELAY[e]`` milliseconds, then sends a response with ``OUT`` = ``IN[e]`` and
``IDX`` = ``e``; then the final flag alone. ``execute`` itself returns after ``WAIT``
milliseconds, whether or not the responses are done, so the instance takes its next request
while the earlier ones still stream.

The config: ``max_batch_size: 0``; inputs ``IN`` (INT32, one dimension), ``DELAY`` (UINT32, the
shape of ``IN``), ``WAIT`` (UINT32, ``[1]``); outputs ``OUT`` (INT32, ``[1]``), ``IDX`` (UINT32,
``[1]``), in that order. Not decoupled, it answers as Triton's frontends make of it: its one
response (``IN`` of one element), else an error.
"""

from __future__ import annotations

import time

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, invalid_arg
from conveyor.workers.backends.base import AnsweredLater, RequestItem, RequestOutcome
from conveyor.workers.backends.triton_test.replies import Replies
from conveyor.workers.backends.triton_test.settings import need, shape_text, type_name
from conveyor.workers.backends.triton_test.timeline import Schedule, Timeline


class RepeatBackend:
    def __init__(self, config: mc.ModelConfig, instance_name: str = "") -> None:
        _validate(config)
        self._decoupled = config.model_transaction_policy.decoupled
        self._timeline = Timeline(instance_name or config.name)

    def execute_requests(self, items: list[RequestItem]) -> list[RequestOutcome]:
        wait_ms = 0
        outcomes: list[RequestOutcome] = []
        for item in items:
            try:
                wait_ms = int(item.inputs["WAIT"].reshape(-1)[0])
                values, delays = _values(item)
            except ConveyorError as exc:  # that request ends with its error; the others go on
                outcomes.append(self._refuse(item, exc))
                continue
            replies = Replies(item, self._decoupled)
            self._timeline.start(_responses(values, delays, replies), replies.fail)
            outcomes.append(AnsweredLater())
        time.sleep(wait_ms / 1000)  # the instance is busy this long (the last request's WAIT)
        return [] if self._decoupled else outcomes

    def _refuse(self, item: RequestItem, error: ConveyorError) -> RequestOutcome:
        if self._decoupled and item.channel is not None:
            item.channel.send(error, True)
        return error

    def close(self) -> None:
        self._timeline.close()


def _values(item: RequestItem) -> tuple[list[int], list[int]]:
    values, delays = item.inputs["IN"], item.inputs["DELAY"]
    if values.shape != delays.shape:  # both may be [-1] in the config: checked per request
        raise invalid_arg(f"expected IN and DELAY shape to match, got {shape_text(list(values.shape))} and "
                          f"{shape_text(list(delays.shape))}")
    return values.reshape(-1).tolist(), delays.reshape(-1).tolist()


def _responses(values: list[int], delays: list[int], replies: Replies) -> Schedule:
    for e, (value, delay_ms) in enumerate(zip(values, delays, strict=True)):
        yield delay_ms / 1000
        replies.send({"OUT": np.array([value], np.int32), "IDX": np.array([e], np.uint32)})
    replies.finish()


def _validate(config: mc.ModelConfig) -> None:
    """The C++ backend's checks, in its order and words."""
    need(config.max_batch_size == 0, "repeat backend only supports models with max_batch_size == 0")
    need(len(config.input) == 3, f"expected 3 inputs, got {len(config.input)}")
    need(len(config.output) == 2, f"expected 2 outputs, got {len(config.output)}")
    tensors: list[mc.ModelInput | mc.ModelOutput] = [*config.input, *config.output]
    for tensor, name, what in zip(tensors, ("IN", "DELAY", "WAIT", "OUT", "IDX"),
                                  ("first input", "second input", "third input", "first output", "second output"),
                                  strict=True):
        need(tensor.name == name, f"expected {what} tensor name to be {name}, got {tensor.name}")
    in_, delay, wait, out, idx = (list(t.dims) for t in tensors)
    need(len(in_) == 1, f"expected IN shape to have one dimension, got {shape_text(in_)}")
    need(in_ == delay, f"expected IN and DELAY shape to match, got {shape_text(in_)} and {shape_text(delay)}")
    for name, dims in (("WAIT", wait), ("OUT", out), ("IDX", idx)):
        need(dims == [1], f"expected {name} shape to be [1], got {shape_text(dims)}")
    for tensor, want in zip(tensors, ("INT32", "UINT32", "UINT32", "INT32", "UINT32"), strict=True):
        got = type_name(tensor.data_type)
        need(got == f"TYPE_{want}", f"expected {tensor.name} datatype to be {want}, got {got}")
