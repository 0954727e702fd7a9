"""``backend: "identity"`` (Triton's identity_backend): each requested ``OUTPUT<i>`` is the
request's ``INPUT<i>``, same datatype and shape, any datatype (BYTES and BF16 included), with or
without batching.

As the C++ backend:

* The config must pair its inputs and outputs: as many of each, named ``INPUT<i>`` / ``OUTPUT<i>``,
  with matching indices, datatypes and shapes (``reshape`` when given); a config that does not
  fails the load in Triton's words.
* ``parameters``: ``execute_delay_ms`` (each execution sleeps that long first),
  ``instance_wise_delay_multiplier`` (with it, instance ``k`` of the model sleeps the delay times
  ``multiplier * k``, at least once the delay), ``creation_delay_sec`` (the load sleeps that long).
* An ``optional`` input the request leaves out gives its output as zeros, shaped by the config's
  dims (1 for each variable one) behind the request's batch size.
* Every response carries the parameters ``param0`` = "an example string parameter",
  ``param1`` = 42, ``param2`` = false, ``param3`` = 123.123.
* The custom metric ``input_byte_size_counter{model, version}`` counts the bytes of the inputs
  that were copied to outputs.

``enable_custom_tracing`` (the C++ backend's own trace activities) is not done: a worker's
backend has no way into the request's trace.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.datatypes import config_to_datatype, numpy_dtype
from conveyor.proto.errors import ConveyorError, Status, invalid_arg, request_prefix
from conveyor.workers.backends.base import ParameterizedOutputs, RequestItem, RequestOutcome, WireTensor
from conveyor.workers.backends.python.pb_utils.metrics import MetricFamily, MetricKind
from conveyor.workers.backends.triton_test.settings import (
    instance_ordinal,
    int_parameter,
    need,
    parameter,
    shape_text,
    stoi,
    type_name,
)

# The response parameters the C++ backend attaches to every response, "to demonstrate" them.
RESPONSE_PARAMETERS: dict[str, Any] = {
    "param0": "an example string parameter", "param1": 42, "param2": False, "param3": 123.123,
}
log = logging.getLogger(__name__)

METRIC = "input_byte_size_counter"
METRIC_HELP = "Cumulative input byte size of all requests received by the model"


class IdentityBackend:
    def __init__(self, path: str, config: mc.ModelConfig, instance_name: str = "") -> None:
        batched = config.max_batch_size > 0
        self._batched = batched
        self._decoupled = config.model_transaction_policy.decoupled
        # OUTPUT<i> -> (INPUT<i>, is it BF16 (its words travel as UINT16 arrays), its zeros when optional)
        self._pairs: dict[str, tuple[str, bool, tuple[np.dtype, tuple[int, ...]] | None]] = {}
        self._datatypes: dict[str, str] = {}  # input -> its datatype, for the verbose log line
        for inp, out in _validated_pairs(config):
            self._datatypes[inp.name] = config_to_datatype(type_name(inp.data_type))
            zeros = None
            if inp.optional:
                dims = tuple(1 if d == -1 else d for d in _shape(inp))
                zeros = (numpy_dtype(config_to_datatype(type_name(inp.data_type))), dims)
            self._pairs[out.name] = (inp.name, inp.data_type == mc.TYPE_BF16, zeros)
        delay_ms = int_parameter(config, "execute_delay_ms")
        multiplier = int_parameter(config, "instance_wise_delay_multiplier") if delay_ms else 0
        if multiplier > 0:
            multiplier *= instance_ordinal(config, instance_name)
        self._delay_s = delay_ms * max(multiplier, 1) / 1000
        # No delay: a batch is a copy, short enough for the worker's main thread (workers/inline.py).
        self.runs_on_any_thread = self._delay_s <= 0
        version = os.path.basename(os.path.dirname(path))
        self._family = MetricFamily(METRIC, METRIC_HELP, MetricKind.COUNTER)
        self._metric = self._family.Metric({"model": config.name, "version": version})
        creation = parameter(config, "creation_delay_sec")
        if creation is not None:
            time.sleep(stoi(creation, "creation_delay_sec"))

    def execute_requests(self, items: list[RequestItem]) -> list[RequestOutcome]:
        if self._delay_s > 0:
            time.sleep(self._delay_s)
        verbose = log.isEnabledFor(logging.DEBUG)
        outcomes = [self._one(item, verbose) for item in items]
        if not self._decoupled:
            return outcomes
        for item, outcome in zip(items, outcomes, strict=True):  # one final response each
            if item.channel is not None:
                item.channel.send(outcome, True)
        return []

    def _one(self, item: RequestItem, verbose: bool = False) -> RequestOutcome:
        inputs = item.inputs
        batch = 0  # the request's batch size (its first input's first dimension) when the model batches
        if self._batched:
            if not inputs:
                return invalid_arg(f"{request_prefix(item.request_id)}out of bounds index 0: request has 0 inputs")
            first = next(iter(inputs.values()))
            batch = first.shape[0] if first.ndim else 0
        out = ParameterizedOutputs(RESPONSE_PARAMETERS)
        copied = 0
        for name in item.outputs:
            pair = self._pairs.get(name)
            if pair is None:
                continue  # not one of the config's outputs: the ingress lets none through
            input_name, bf16, zeros = pair
            array = inputs.get(input_name)
            if array is None:
                if zeros is None:
                    return ConveyorError(Status.UNSUPPORTED, f"failed to get input '{input_name}'")
                out[name] = _zeros(zeros, batch, bf16)
                continue
            if array.dtype == np.object_:
                nbytes = sum(4 + len(e) for e in array.reshape(-1))
                out[name] = array
            elif bf16:  # its datatype is not the numpy array's: say it
                nbytes = array.nbytes
                out[name] = WireTensor("BF16", list(array.shape), array.tobytes())
            else:
                nbytes = array.nbytes
                out[name] = array
            copied += nbytes
            if verbose:  # the C++ backend's verbose line, which Triton's QA (L0_backend_identity) counts
                log.debug("\tinput %s: datatype = %s, shape = %s, byte_size = %d, buffer_count = %d", input_name,
                          self._datatypes[input_name], shape_text(list(array.shape)), nbytes, 1 if nbytes else 0)
        if copied:
            self._metric.increment(copied)
        return out

    def close(self) -> None:
        del self._metric, self._family  # the metric's series goes with the model's last instance here


def _zeros(zeros: tuple[np.dtype, tuple[int, ...]], batch: int, bf16: bool) -> np.ndarray | WireTensor:
    """An optional input's output when the request leaves the input out: zeros (empty strings)."""
    dtype, dims = zeros
    shape = (batch, *dims) if batch else dims
    if bf16:
        return WireTensor("BF16", list(shape), bytes(2 * int(np.prod(shape))))
    return np.full(shape, b"", np.object_) if dtype == np.object_ else np.zeros(shape, dtype)


def _validated_pairs(config: mc.ModelConfig) -> list[tuple[mc.ModelInput, mc.ModelOutput]]:
    """The config's (input, output) pairs, checked as the C++ backend checks them."""
    need(len(config.input) == len(config.output), "model configuration must have equal input/output pairs")
    inputs: dict[str, mc.ModelInput] = {}
    outputs: dict[str, mc.ModelOutput] = {}
    for inp, out in zip(config.input, config.output, strict=True):
        need(inp.name.startswith("INPUT"), f"expected input name to follow INPUT<index> pattern, got '{inp.name}'")
        need(out.name.startswith("OUTPUT"),
             f"expected output name to follow OUTPUT<index> pattern, got '{out.name}'")
        inputs.setdefault(inp.name[len("INPUT"):], inp)
        outputs.setdefault(out.name[len("OUTPUT"):], out)
    pairs = []
    for index, out in sorted(outputs.items()):
        inp = inputs.get(index)  # type: ignore[assignment]
        need(inp is not None, "expected input and output indices to match")
        assert inp is not None
        need(inp.data_type == out.data_type, "expected input and output datatype to match, got "
             f"{type_name(inp.data_type)} and {type_name(out.data_type)}")
        need(_shape(inp) == _shape(out), "expected input and output shape to match, got "
             f"{shape_text(_shape(inp))} and {shape_text(_shape(out))}")
        pairs.append((inp, out))
    return pairs


def _shape(tensor: mc.ModelInput | mc.ModelOutput) -> list[int]:
    return list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
