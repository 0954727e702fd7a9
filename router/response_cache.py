"""Triton's response cache (``response_cache { enable: true }`` plus
``--cache-config local,size=N``), without copying a byte.

A cached response stays where its worker wrote it: the cache holds the
response's block (``HeldBlocks``), and each hit lends it to the ingress with a
loan (``Loans``), so an entry evicted while a hit is still being copied out
stays alive until that copy is done. The size bound counts the bytes of the
outputs the entries keep alive.

The key is (model, version, the ingress's hash of the inputs and parameters,
the requested outputs); see ``ingress/request_hash.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from conveyor.proto import messages as m
from conveyor.proto.errors import invalid_arg
from conveyor.router.shared_memory.held_blocks import HeldBlocks

CacheKey = tuple[str, str, bytes, tuple[tuple[str, int], ...]]


@dataclass(frozen=True, slots=True)
class CachedResponse:
    outputs: list[m.TensorRef]
    blocks: list[m.Release]
    nbytes: int


def cache_key(model: str, version: str, request: m.InferRequest) -> CacheKey:
    return (model, version, request.cache_key, tuple((o.name, o.classification) for o in request.outputs))


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
        nbytes = sum(t.nbytes for t in outputs)
        if key in self._entries or nbytes > self.capacity or not blocks:
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
