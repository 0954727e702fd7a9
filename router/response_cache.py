"""Triton's response cache (``response_cache { enable: true }`` plus
``--cache-config local,size=N``), without copying a byte.

A cached response stays where its worker wrote it: the cache holds the
response's block (``HeldBlocks``), and each hit lends it to the ingress with a
loan (``Loans``), so an entry evicted while a hit is still being copied out
stays alive until that copy is done. The size bound counts an entry as Triton's
local cache does (its serialized form: each output's name, datatype, shape and
bytes, with their lengths), so that a ``--cache-config local,size=N`` holds what it
holds in Triton; an entry larger than the whole cache is not kept, and logged in
Triton's words.

The key is (model, version, the ingress's hash of the inputs and parameters,
the requested outputs); see ``proto/request_hash.py``. An ensemble's step is hashed
by the router itself (``step_hash``), in its loop: bounded by ``STEP_HASH_MAX_BYTES``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from conveyor.proto import messages as m
from conveyor.proto.errors import invalid_arg
from conveyor.proto.request_hash import hash_request
from conveyor.router.shared_memory.held_blocks import HeldBlocks

log = logging.getLogger(__name__)

CacheKey = tuple[str, str, bytes, tuple[tuple[str, int], ...]]

# Triton's serialized entry (core's cache_entry.cc): a uint32 output count, then per output a uint64
# size, uint32-prefixed name, datatype and shape (int64 each), and a uint64-prefixed buffer.
_ENTRY_HEADER = 4
_OUTPUT_HEADER = 8 + 4 + 4 + 4 + 8


def entry_size(outputs: list[m.TensorRef]) -> int:
    """The bytes Triton's local cache takes for a response with these outputs."""
    return _ENTRY_HEADER + sum(_OUTPUT_HEADER + len(t.name.encode()) + len(t.datatype) + 8 * len(t.shape) + t.nbytes
                               for t in outputs)


@dataclass(frozen=True, slots=True)
class CachedResponse:
    outputs: list[m.TensorRef]
    blocks: list[m.Release]
    nbytes: int


# The most input bytes an ensemble's step may have for the router to hash them (about 1 ms of its loop, at
# BLAKE2b's ~1 GB/s): a larger step runs without the cache rather than holding every other request up.
# Triton hashes in the step's own thread; the router's loop must never wait on slow work.
STEP_HASH_MAX_BYTES = 1 << 20


def step_hash(req: m.InferRequest, view: Callable[[m.TensorRef], np.ndarray]) -> bytes:
    """An ensemble's step's cache key, hashed as the ingress hashes a client's request to the same model (so
    both share one entry), from the bytes the steps before it wrote (``view``). ``b""`` (not cached) for a step
    that reads or writes a client's region (the ingress keys no such request) or has more than
    ``STEP_HASH_MAX_BYTES`` of inputs."""
    if req.regions or any(o.region for o in req.outputs) or sum(r.nbytes for r in req.inputs) > STEP_HASH_MAX_BYTES:
        return b""
    return hash_request(req.inputs, view, req.parameters)


def cache_key(model: str, version: str, request: m.InferRequest) -> CacheKey:
    # In name order: an ensemble's step names its outputs in its own order, a client in another.
    return (model, version, request.cache_key, tuple(sorted((o.name, o.classification) for o in request.outputs)))


class ResponseCache:
    def __init__(self, capacity: int, holds: HeldBlocks) -> None:
        self.capacity = capacity
        self.used = 0
        self._holds = holds
        self._entries: OrderedDict[CacheKey, CachedResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CacheKey) -> CachedResponse | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: CacheKey, outputs: list[m.TensorRef], blocks: list[m.Release]) -> bool:
        """Keep this response (holding its blocks); False when it is not kept (too big, or there already)."""
        if key in self._entries or not blocks:
            return False
        nbytes = entry_size(outputs)
        if nbytes > self.capacity:
            # Triton's words (core's dynamic_batch_scheduler.cc, ensemble_scheduler.cc; the local cache's).
            log.error("Failed to insert key [%s] into response cache: Cache entry is larger than total cache size",
                      key[2].hex())
            return False
        while self.used + nbytes > self.capacity:
            self._evict()
        for block in blocks:
            self._holds.hold(block)
        self._entries[key] = CachedResponse(outputs, blocks, nbytes)
        self.used += nbytes
        return True

    def forget_region(self, region: str) -> None:
        """A worker left: its arena, and the responses in it, are gone."""
        for key, entry in list(self._entries.items()):
            if any(b.region == region for b in entry.blocks):
                del self._entries[key]
                self.used -= entry.nbytes

    def _evict(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self.used -= entry.nbytes
        for block in entry.blocks:
            self._holds.drop(block)


def parse_cache_config(values: list[str]) -> int:
    """The local cache's size in bytes from Triton's ``--cache-config local,size=N`` flags (0: no cache)."""
    size = 0
    for value in values:
        name, _, setting = value.partition(",")
        key, _, number = setting.partition("=")
        if name != "local":
            raise invalid_arg(f"--cache-config {value}: only the 'local' cache is supported")
        if key != "size" or not number.isdigit():
            raise invalid_arg(f"--cache-config {value}: expected local,size=<bytes>")
        size = int(number)
    return size
