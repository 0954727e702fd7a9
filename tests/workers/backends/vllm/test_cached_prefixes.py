"""An engine's KV-cache events (vLLM's own event types) turned into the router's prefix keys it evicted:
a key goes with the block its prompt's head ends in, a key past the last whole block with the deepest
block, a head another request cached first stays with that request's blocks, a prompt too short for a
block was never cached, a cleared cache (or lost events) clears all, and the record stays bounded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conveyor.proto.prefix_keys import IDS_PER_KEY, block_keys
from conveyor.workers.backends.vllm import cached_prefixes
from conveyor.workers.backends.vllm.cached_prefixes import CachedPrefixes

pytest.importorskip("vllm")
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

LEVEL = "slow"

BLOCK = 16  # tokens a block; a token's text is 2 bytes (ids from 1000: 8): 32 bytes a block, two blocks a key
LONG = 1000


def _text(tokens: list[int]) -> str:
    return "".join(f"{t % 100:02d}" if t < LONG else "x" * 8 for t in tokens)


class _Engine:
    """Blocks as an engine stores them: hash = the block's place and its tokens, chained."""

    def __init__(self) -> None:
        self.reports: list[tuple[list[int], bool]] = []
        self.record = CachedPrefixes(_text, lambda keys, everything: self.reports.append((keys, everything)))

    def store(self, tokens: list[int], session: str, parent: int | None = None, first: int = 0) -> list[int]:
        """Blocks ``first``.. of ``tokens`` (whole blocks only), built on ``parent``: their hashes."""
        hashes = [hash(tuple(tokens[:(b + 1) * BLOCK])) for b in range(first, len(tokens) // BLOCK)]
        self.record.on_events([BlockStored(
            block_hashes=hashes, parent_block_hash=parent, token_ids=tokens[first * BLOCK:len(hashes) * BLOCK
                                                                                 + first * BLOCK],
            block_size=BLOCK, lora_id=None, medium="GPU", lora_name=None, session_id=session)])
        return hashes

    def remove(self, *hashes: int) -> list[int]:
        self.reports.clear()
        self.record.on_events([BlockRemoved(block_hashes=list(hashes), medium="GPU")])
        return [k for keys, _ in self.reports for k in keys]


@pytest.fixture
def engine() -> Iterator[_Engine]:
    yield _Engine()


def test_a_key_goes_with_the_block_its_head_ends_in(engine: _Engine) -> None:
    tokens = list(range(8 * BLOCK))  # 256 bytes: 4 keys, ending with blocks 1, 3, 5, 7
    keys = block_keys(_text(tokens).encode(), "")
    assert len(keys) == 4
    engine.record.begin("s", keys, by_ids=False)
    hashes = engine.store(tokens, "s")
    engine.record.end("s")
    assert engine.remove(hashes[7], hashes[6]) == [keys[3]]
    assert engine.remove(hashes[4]) == []
    assert engine.remove(hashes[5]) == [keys[2]]
    assert engine.remove(hashes[1], hashes[0]) == [keys[0]]
    assert engine.remove(hashes[1]) == []  # gone already


def test_a_key_past_the_last_whole_block_goes_with_the_deepest(engine: _Engine) -> None:
    tokens = list(range(9 * BLOCK)) + [LONG] * 5  # 328 bytes: 5 keys, the last ending at 320, past 9 whole blocks
    keys = block_keys(_text(tokens).encode(), "")
    assert len(keys) == 5
    engine.record.begin("s", keys, by_ids=False)
    hashes = engine.store(tokens, "s")
    assert engine.remove() == []
    engine.record.end("s")
    assert engine.remove(hashes[8]) == [keys[4]]


def test_a_head_cached_by_an_earlier_request_stays_with_its_blocks(engine: _Engine) -> None:
    system = list(range(4 * BLOCK))  # 128 bytes: 2 keys, ending with blocks 1 and 3
    first, second = system + [1] * (4 * BLOCK), system + [2] * (4 * BLOCK)
    keys_1, keys_2 = (block_keys(_text(t).encode(), "") for t in (first, second))
    assert keys_1[:2] == keys_2[:2] and keys_1[2:] != keys_2[2:]
    engine.record.begin("one", keys_1, by_ids=False)
    hashes_1 = engine.store(first, "one")
    engine.record.end("one")
    engine.record.begin("two", keys_2, by_ids=False)  # its head is a cache hit: only its own blocks stored
    hashes_2 = engine.store(second, "two", parent=hashes_1[3], first=4)
    engine.record.end("two")
    assert engine.remove(*hashes_2[::-1]) == keys_2[3:1:-1]  # not the shared head's keys
    assert engine.remove(*hashes_1[::-1]) == keys_1[3:1:-1] + keys_1[1::-1]


def test_a_prompt_shorter_than_a_block_was_never_cached(engine: _Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cached_prefixes, "SETTLE_S", 0.0)
    engine.record.begin("short", [11, 12], by_ids=False)
    engine.record.end("short")  # no block of it came
    assert engine.remove() == [11, 12]  # reported with the next events, once settled


def test_a_cleared_cache_or_lost_events_clear_everything(engine: _Engine) -> None:
    tokens = list(range(4 * BLOCK))
    keys = block_keys(_text(tokens).encode(), "")
    engine.record.begin("s", keys, by_ids=False)
    hashes = engine.store(tokens, "s")
    engine.record.on_events([AllBlocksCleared()])
    assert engine.reports[-1] == ([], True)
    assert engine.remove(*hashes) == []  # nothing of them is known now
    engine.record.lost()
    assert engine.reports[-1] == ([], True)


def test_blocks_built_on_an_unknown_block_are_passed_over(engine: _Engine) -> None:
    tokens = list(range(8 * BLOCK))
    engine.record.begin("s", block_keys(_text(tokens).encode(), ""), by_ids=False)
    hashes = engine.store(tokens, "s", parent=12345, first=4)
    assert engine.remove(*hashes) == []


def test_a_prompt_of_token_ids_is_keyed_by_its_blocks_places(engine: _Engine) -> None:
    tokens = list(range(4 * BLOCK))  # 64 ids: 4 keys of 16 ids, one a block
    keys = [101, 102, 103, 104]
    assert IDS_PER_KEY == BLOCK
    engine.record.begin("ids", keys, by_ids=True)
    hashes = engine.store(tokens, "ids")
    engine.record.end("ids")
    assert engine.remove(hashes[2]) == [103]
    assert engine.remove(hashes[0]) == [101]


def test_the_record_stays_bounded(engine: _Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cached_prefixes, "MAX_BLOCKS", 8)
    monkeypatch.setattr(cached_prefixes, "MAX_SESSIONS", 2)
    for s in range(5):
        engine.record.begin(f"s{s}", [s], by_ids=False)
    assert len(engine.record._sessions) == 2
    tokens = list(range(8 * BLOCK))
    keys = block_keys(_text(tokens).encode(), "")
    engine.record.begin("big", keys, by_ids=False)
    engine.store(tokens, "big")
    engine.reports.clear()
    engine.store([7] * (4 * BLOCK), "other")  # 4 more blocks: the 4 oldest go, with their keys
    assert len(engine.record._blocks) == 8
    assert [k for r, _ in engine.reports for k in r] == keys[:2]
