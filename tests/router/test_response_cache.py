"""The response cache's bookkeeping: Triton's flag syntax, LRU by size, and the
release flags of the blocks it keeps alive."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError
from conveyor.router.response_cache import STEP_HASH_MAX_BYTES, ResponseCache, cache_key, parse_cache_config, step_hash
from conveyor.router.shared_memory.held_blocks import HeldBlocks
from conveyor.shm.arena import HELD, OUTSTANDING, RELEASED, Arena
from conveyor.shm.naming import segment_name

LEVEL = "unit"


def test_cache_config_syntax() -> None:
    assert parse_cache_config([]) == 0
    assert parse_cache_config(["local,size=1048576"]) == 1 << 20
    with pytest.raises(ConveyorError, match="only the 'local' cache"):
        parse_cache_config(["redis,host=localhost"])
    with pytest.raises(ConveyorError, match="local,size=<bytes>"):
        parse_cache_config(["local,size=lots"])


def test_entries_hold_their_blocks_until_evicted() -> None:
    arena = Arena(segment_name(f"u{os.getpid()}", "worker"), 4096)
    try:
        cache = ResponseCache(200, HeldBlocks())  # an entry takes 108 bytes (Triton's size)

        def entry(i: int) -> tuple[list[m.TensorRef], list[m.Release]]:
            return [m.TensorRef("OUT", "INT32", [15], arena.name, 64 * (i + 1), 60)], [m.Release(arena.name, i)]

        keys = [cache_key("model", "1", m.InferRequest(0, "model", "", [], [m.OutputSpec("OUT")], cache_key=bytes([i])))
                for i in range(3)]
        assert cache.put(keys[0], *entry(0))
        assert not cache.put(keys[0], *entry(0))  # there already
        assert arena.array[0] == HELD
        assert cache.get(keys[0]) is not None and cache.get(keys[1]) is None
        assert cache.put(keys[1], *entry(1))  # 216 bytes > 200: the oldest goes
        assert cache.get(keys[0]) is None and arena.array[0] == RELEASED
        assert arena.array[1] == HELD and cache.used == 108
        big = [m.TensorRef("OUT", "INT32", [50], arena.name, 256, 200)]
        assert not cache.put(keys[2], big, [m.Release(arena.name, 2)])  # larger than the whole cache
        assert arena.array[2] == OUTSTANDING
    finally:
        arena.close()


def test_an_entry_larger_than_the_cache_is_logged_in_tritons_words(caplog: pytest.LogCaptureFixture) -> None:
    """qa/L0_response_cache's test_ensemble_cache_insertion_failure (a 200-byte cache): two FP32 [1, 16]
    outputs take 242 bytes in Triton's entry (128 of data), so they are not kept, and the log says so."""
    arena = Arena(segment_name(f"v{os.getpid()}", "worker"), 4096)
    try:
        cache = ResponseCache(200, HeldBlocks())
        outputs = [m.TensorRef(f"OUTPUT{i}", "FP32", [1, 16], arena.name, 64 + 64 * i, 64) for i in range(2)]
        key = cache_key("ens", "1", m.InferRequest(0, "ens", "", [], [], cache_key=b"\x01\x02"))
        with caplog.at_level("ERROR"):
            assert not cache.put(key, outputs, [m.Release(arena.name, 0)])
        assert "Failed to insert key [0102] into response cache: Cache entry is larger than total cache size" \
            in caplog.text
        assert arena.array[0] == OUTSTANDING and len(cache) == 0
    finally:
        arena.close()


def test_a_step_is_hashed_as_a_client_request_up_to_its_bound() -> None:
    """An ensemble's step keyed in the router's loop: alike for the same inputs, and not at all (no cache)
    past STEP_HASH_MAX_BYTES of inputs, which would hold every other request up while it hashes."""
    data = {"small": np.arange(16, dtype=np.int32), "large": np.zeros(STEP_HASH_MAX_BYTES // 4 + 1, np.int32)}

    def step(name: str) -> m.InferRequest:
        ref = m.TensorRef("INPUT0", "INT32", [data[name].size], name, 0, data[name].nbytes)
        return m.InferRequest(0, "model", "", [ref], [m.OutputSpec("OUTPUT0")])

    def view(ref: m.TensorRef) -> np.ndarray:
        return data[ref.region].view(np.uint8)

    small = step_hash(step("small"), view)
    assert small and small == step_hash(step("small"), view)
    assert step_hash(step("large"), view) == b""
