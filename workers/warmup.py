"""``model_warmup``: the config's samples, run on a freshly loaded instance
before the worker reports it loaded, so the model is not READY until warm.

Triton's rules (core ``TritonModelInstance::GenerateWarmupData``/``WarmUp``):

* a sample with ``batch_size`` 0 is skipped; one with ``count`` 0 runs once;
* each sample is ``batch_size`` requests of one row each (``[1] + dims`` for a
  batching model, ``dims`` otherwise), sent to the backend as one execution;
* ``zero_data`` is zeros (empty strings for TYPE_STRING), ``random_data``
  random bytes (zeros for TYPE_STRING), ``input_data_file`` the raw
  row-major bytes of ``<model>/warmup/<file>`` (TYPE_STRING: length-prefixed);
* the first failing sample fails the instance: ``failed to run warmup sample
  '<name>': <error>; ``.

The samples never reach the router, so they count in no statistics (as in Triton).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.datatypes import config_to_datatype, deserialize_bytes, element_count, numpy_dtype
from conveyor.proto.errors import ConveyorError, Status, invalid_arg
from conveyor.proto.repository_files import read_bytes
from conveyor.workers.backends.base import Backend, RequestBackend, RequestItem
from conveyor.workers.batch_layout import BatchLayout
from conveyor.workers.loop_replies import LoopReplies

log = logging.getLogger(__name__)

WARMUP_FOLDER = "warmup"


class _Collect:
    """The response channel of a warmup request to a decoupled model: keeps the errors."""

    def __init__(self, errors: list[str]) -> None:
        self.cancelled = False
        self._errors = errors
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, outcome: Any, final: bool, output_ns: int = 0) -> None:
        if isinstance(outcome, ConveyorError):
            self._errors.append(outcome.message)
        self._closed = self._closed or final

    def fail(self, error: ConveyorError) -> None:
        self._errors.append(error.message)
        self._closed = True

    def add_cancel_hook(self, hook: Callable[[], None]) -> None:
        pass  # a warmup request is never cancelled

    def remove_cancel_hook(self, hook: Callable[[], None]) -> None:
        pass

    def reply_from(self, replies: LoopReplies) -> None:
        pass  # nothing leaves the worker


def warm_up(
    backend: Backend | RequestBackend, config: mc.ModelConfig, model_dir: str, per_request: bool,
    layout: BatchLayout | None = None, instance: str = "",
) -> None:
    """Run every warmup sample on ``backend``; raises the first failure (INVALID_ARG, as Triton).
    ``layout``: the batch is assembled as the model's requests' are (ragged, padded, batch inputs);
    ``instance``: the instance's name, which Triton's verbose log lines name."""
    for sample in config.model_warmup:
        if sample.batch_size == 0:
            continue
        rows = [sample_inputs(sample, config, model_dir) for _ in range(sample.batch_size)]
        for iteration in range(1, max(sample.count, 1) + 1):
            log.debug("model '%s' instance %s is running warmup sample '%s' for iteration %d", config.name,
                      instance, sample.name, iteration)
            errors = _run(backend, config, rows, per_request, layout)
            if errors:
                log.debug("model '%s' instance %s failed to run warmup sample '%s'", config.name, instance,
                          sample.name)
                raise ConveyorError(
                    Status.INVALID_ARG, f"failed to run warmup sample '{sample.name}': " + "".join(
                        f"{e}; " for e in errors)
                )


def sample_inputs(sample: mc.ModelWarmup, config: mc.ModelConfig, model_dir: str) -> dict[str, np.ndarray]:
    """One request's inputs for ``sample``."""
    batched = config.max_batch_size > 0
    inputs: dict[str, np.ndarray] = {}
    for name, spec in sample.inputs.items():
        dims = list(spec.dims)
        count = element_count(dims)
        if count < 0:
            raise invalid_arg(
                f"warmup setting expects all variable-size dimensions are specified for input '{name}'"
            )
        datatype = config_to_datatype(mc.DataType.Name(spec.data_type))
        shape = ([1] if batched else []) + dims
        inputs[name] = _data(spec, datatype, count, model_dir, name).reshape(shape)
    return inputs


def _data(spec: mc.ModelWarmup.Input, datatype: str, count: int, model_dir: str, name: str) -> np.ndarray:
    kind = spec.WhichOneof("input_data_type")
    if kind is None:
        raise invalid_arg(f"warmup setting expects input '{name}' to have input_data_type set")
    if datatype == "BYTES":
        if kind == "input_data_file":
            return deserialize_bytes(_read(model_dir, spec.input_data_file), count)
        return np.array([b""] * count, dtype=np.object_)
    dtype = numpy_dtype(datatype)
    nbytes = count * dtype.itemsize
    if kind == "zero_data":
        return np.zeros(count, dtype)
    if kind == "random_data":
        return np.frombuffer(np.random.bytes(nbytes), dtype).copy()
    raw = _read(model_dir, spec.input_data_file)
    if len(raw) < nbytes:
        raise invalid_arg(
            f"warmup setting expects {nbytes} bytes, but the data provided from {spec.input_data_file} "
            f"only has {len(raw)} bytes"
        )
    return np.frombuffer(raw[:nbytes], dtype).copy()


def _read(model_dir: str, filename: str) -> bytes:
    path = os.path.join(model_dir, WARMUP_FOLDER, filename)
    try:
        return read_bytes(path, limit=None)  # never a FIFO's wait, nor a device's endless read
    except OSError as exc:
        log.error("unable to read warmup data file '%s': %s", path, exc)
        # The config's name for the file only: the server's folders are not the client's business.
        raise invalid_arg(f"unable to read warmup data file '{filename}': {exc.strerror}") from None


def _run(
    backend: Backend | RequestBackend, config: mc.ModelConfig, rows: list[dict[str, np.ndarray]], per_request: bool,
    layout: BatchLayout | None,
) -> list[str]:
    """One execution of the sample's requests; the errors it produced."""
    outputs = [o.name for o in config.output]
    errors: list[str] = []
    try:
        if per_request:
            items = [RequestItem("", inputs, outputs, {}, _Collect(errors)) for inputs in rows]
            for outcome in cast(RequestBackend, backend).execute_requests(items) or []:
                if isinstance(outcome, ConveyorError):
                    errors.append(outcome.message)
        elif layout is not None and config.max_batch_size > 0:
            cast(Backend, backend).execute(layout.assemble({n: [r[n] for r in rows] for n in rows[0]}, len(rows)),
                                           outputs)
        elif config.max_batch_size > 0:
            batch = {name: np.concatenate([r[name] for r in rows]) for name in rows[0]}
            cast(Backend, backend).execute(batch, outputs)
        else:  # no batch dimension to stack along: one execution per request
            for inputs in rows:
                cast(Backend, backend).execute(layout.assemble({n: [a] for n, a in inputs.items()}, 1)
                                               if layout is not None else inputs, outputs)
    except ConveyorError as exc:
        errors.append(exc.message)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    return errors
