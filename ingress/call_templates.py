"""Requests whose description was seen before, made from a template.

A client sends the same request description again and again: tritonclient and
perf_analyzer write the same names, datatypes, shapes, parameters and outputs
for every request of a given shape, and only the tensor bytes change. An
adapter keeps what its codec made of such a description (a ``CallTemplate``),
keyed by the description's bytes (the HTTP JSON header, the gRPC message
without its raw contents), and makes the next request with those bytes from
it: no parsing and none of the codec's checks, only the new tensor bytes. The
template is also the call's ``InferCall.shape_key``: the data plane keeps the
verdict of its signature checks per template (``ModelSignature.verdicts``), so
those are skipped too.

Only calls whose inputs all come from the request's binary tensors or from client
shared memory become templates: typed or JSON data would be arrays to copy per
request. A shared-memory placement is part of the description (region, offset,
size): the template keeps it, and the router checks it against the registration
for every request as before. The caches are small and cleared when full, so a
client that puts a fresh id in every request only pays for a dictionary miss.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from conveyor.ingress.dataplane import InferCall
from conveyor.proto.request_checks import InferInput, RequestedOutput, TensorData
from conveyor.proto.shm_params import ShmPlacement

MAX_TEMPLATES = 256


@dataclass(frozen=True, slots=True)
class TemplateInput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: dict[str, Any]
    source: int  # which of the request's binary tensors holds its bytes (-1: ``shm`` does)
    shm: ShmPlacement | None = None


@dataclass(frozen=True, slots=True, eq=False)
class CallTemplate:
    """What a codec made of one request description; compared and hashed by identity (a shape key)."""

    inputs: tuple[TemplateInput, ...]
    outputs: tuple[RequestedOutput, ...] | None
    request_id: str
    parameters: dict[str, Any]

    def call(self, model: str, version: str, sources: Sequence[TensorData], timeout_s: float | None = None
             ) -> InferCall:
        """The call this description makes over ``sources``, the new request's binary tensors. Each
        call owns its lists and dictionaries: header forwarding adds to its parameters."""
        inputs = [
            InferInput(t.name, t.datatype, list(t.shape), None if t.shm else sources[t.source],
                       dict(t.parameters) if t.parameters else {}, t.shm)
            for t in self.inputs
        ]
        return InferCall(model, version, inputs, None if self.outputs is None else list(self.outputs),
                         self.request_id, dict(self.parameters) if self.parameters else {}, timeout_s,
                         shape_key=self)


def template_of(call: InferCall, sources: Sequence[TensorData]) -> CallTemplate | None:
    """``call``'s template, when each input lies in client shared memory or its data is the next
    of ``sources``; None otherwise. Copies what the first call keeps using."""
    inputs: list[TemplateInput] = []
    used = 0
    for inp in call.inputs:
        if inp.shm is not None:
            source = -1
        elif used < len(sources) and inp.data is sources[used]:  # JSON or typed data is never a source
            source, used = used, used + 1
        else:
            return None
        inputs.append(TemplateInput(inp.name, inp.datatype, tuple(inp.shape), dict(inp.parameters), source, inp.shm))
    if used != len(sources):
        return None
    outputs = None if call.outputs is None else tuple(call.outputs)
    return CallTemplate(tuple(inputs), outputs, call.id, dict(call.parameters))


K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class TemplateCache(Generic[K, T]):
    """Templates by their description's key; emptied when full (one per ingress process: its
    event loop is the only user)."""

    def __init__(self, capacity: int = MAX_TEMPLATES) -> None:
        self.capacity = capacity
        self._entries: dict[K, T] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> T | None:
        return self._entries.get(key)

    def put(self, key: K, template: T) -> None:
        entries = self._entries
        if len(entries) >= self.capacity:
            entries.clear()
        entries[key] = template
