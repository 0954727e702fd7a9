"""Which of the router's prefix keys one engine's cache holds, from its KV-cache events: what it evicts
goes to the router, which then stops sending prompts to that engine for a head it no longer has
(router/scheduling/engine_placement.py; docs/LLM.md, "Several engines").

The router keys a prompt by its text, 64 bytes a key (proto/prefix_keys.py); the engine caches it by its
tokens, ``block_size`` a block. Each request the engine runs is announced here with its keys under a
session id the engine puts on the events of its blocks (vLLM's ``session_id``). A stored block's place in
its prompt is its parent's plus one; its end in the text is its parent's plus the length of its own
tokens' text (their ``decode``: exact for byte-level tokenizers, within a byte a block for others). A key
belongs to the first block whose text reaches its end, or, for a key past the prompt's last whole block
(which the engine never caches), to the prompt's deepest block, which an engine evicts before the blocks
it builds on. When a block is evicted its keys are; when the cache is cleared, or events were lost, all
are (``everything``), and the router forgets what it sent the engine.

A prompt of token ids is keyed 16 ids a key: its blocks' places decide, no text needed.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor.proto.prefix_keys import IDS_PER_KEY, KEYED_BYTES, PREFIX_BLOCK_BYTES

# Only blocks that begin within the keyed head of a prompt (KEYED_BYTES) carry keys; deeper ones are
# not decoded.
# Blocks remembered at most (~150 bytes each: ~40 MiB). An engine evicts what it no longer holds, so
# this bounds only an engine whose events stop saying so; past it the oldest go, their keys reported.
MAX_BLOCKS = 1 << 18
# Requests announced and not yet tied to their blocks (~1 KiB each); past it the oldest are dropped,
# their keys left as the router recorded them.
MAX_SESSIONS = 4096
# A request that ended without any of its blocks stored is given this long for its events to arrive
# (they travel apart from its outputs); after it, its prompt was too short for a whole block, and its
# keys were never cached.
SETTLE_S = 5.0

Report = Callable[[list[int], bool], None]  # (keys evicted, everything)


@dataclass(slots=True)
class _Block:
    depth: int  # its place in its prompt: 0 for the first block
    end: int  # where its text ends in its prompt, in bytes; -1 when not known (not decoded)
    keys: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Session:
    keys: list[int]
    by_ids: bool  # keyed on token ids, not text
    next_key: int = 0  # keys before it belong to a block
    deepest: int | None = None  # the hash of its deepest block stored so far
    ended: float = 0.0  # when its request ended (monotonic), 0 while it runs


class CachedPrefixes:
    """One engine's record, fed on the engine's event loop; ``report`` is told what the engine evicted."""

    def __init__(self, decode: Callable[[list[int]], str], report: Report) -> None:
        """``decode``: the engine tokenizer's text of some token ids (special tokens left out)."""
        self._decode = decode
        self._report = report
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._ending: deque[tuple[float, str]] = deque()  # requests ended with no block stored, oldest first

    def begin(self, session: str, keys: list[int], by_ids: bool) -> None:
        """A request with these prefix keys goes to the engine under ``session``."""
        if not keys:
            return
        self._sessions[session] = _Session(keys, by_ids)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)

    def end(self, session: str) -> None:
        """The request ended: its keys past its last whole block go with its deepest block."""
        found = self._sessions.get(session)
        if found is None:
            return
        if found.deepest is None:
            found.ended = time.monotonic()  # its blocks' events may yet come
            self._ending.append((found.ended, session))
            return
        del self._sessions[session]
        self._settle(found)

    def on_events(self, events: list[Any]) -> None:
        """One batch of the engine's events, in order."""
        evicted: list[int] = []
        for event in events:
            kind = type(event).__name__
            if kind == "BlockStored":
                self._stored(event)
            elif kind == "BlockRemoved":
                for block_hash in event.block_hashes:
                    block = self._blocks.pop(block_hash, None)
                    if block is not None:
                        evicted += block.keys
            elif kind == "AllBlocksCleared":
                self.lost()
                evicted = []
        self._expire(evicted)
        if evicted:
            self._report(evicted, False)

    def lost(self) -> None:
        """The engine's cache was cleared, or its events were lost: nothing of it is known now."""
        self._blocks.clear()
        for session in self._sessions.values():
            session.next_key, session.deepest = 0, None
        self._report([], True)

    def _stored(self, event: Any) -> None:
        parent_hash = event.parent_block_hash
        if parent_hash is None:
            depth, end = 0, 0
        else:
            parent = self._blocks.get(parent_hash)
            if parent is None:
                return  # built on a block this record never saw: its place is not known
            depth, end = parent.depth + 1, parent.end
        size = event.block_size
        tokens = event.token_ids
        session = self._sessions.get(event.session_id) if event.session_id else None
        if session is not None and depth and not session.next_key:
            self._skip(session, depth * size, end)  # its head was cached: those keys are its ancestors'
        blocks = self._blocks
        for i, block_hash in enumerate(event.block_hashes):
            if 0 <= end < KEYED_BYTES:
                end += len(self._decode(tokens[i * size:(i + 1) * size]).encode())
            else:
                end = -1
            block = blocks.get(block_hash)
            if block is None:
                block = blocks[block_hash] = _Block(depth, end)
            else:
                blocks.move_to_end(block_hash)  # reused: the engine keeps it longer
            if session is not None:
                self._cover(session, block, block_hash, size)
            depth += 1
        while len(blocks) > MAX_BLOCKS:
            _, old = blocks.popitem(last=False)
            if old.keys:
                self._report(old.keys, False)
        if session is not None and session.ended:
            del self._sessions[event.session_id]
            self._settle(session)

    @staticmethod
    def _cover(session: _Session, block: _Block, block_hash: int, size: int) -> None:
        """The session's keys whose head ends within ``block`` (of ``size`` tokens) belong to it."""
        keys = session.keys
        i = session.next_key
        if session.by_ids:
            while i < len(keys) and (i + 1) * IDS_PER_KEY <= (block.depth + 1) * size:
                i += 1
        elif block.end >= 0:
            while i < len(keys) and (i + 1) * PREFIX_BLOCK_BYTES <= block.end:
                i += 1
        _hold(block, keys[session.next_key:i])
        session.next_key = i
        session.deepest = block_hash

    @staticmethod
    def _skip(session: _Session, tokens: int, end: int) -> None:
        """Pass the session's keys whose head ends within the first ``tokens`` (``end`` bytes): the blocks
        that hold them were stored by an earlier request with the same head, and carry the same keys."""
        keys = session.keys
        i = 0
        if session.by_ids:
            while i < len(keys) and (i + 1) * IDS_PER_KEY <= tokens:
                i += 1
        else:
            while i < len(keys) and (i + 1) * PREFIX_BLOCK_BYTES <= end:
                i += 1
        session.next_key = i

    def _settle(self, session: _Session) -> None:
        """An ended request's keys past its deepest block: that block's, or evicted if it is gone."""
        rest = session.keys[session.next_key:]
        if not rest:
            return
        deepest = self._blocks.get(session.deepest) if session.deepest is not None else None
        if deepest is not None:
            _hold(deepest, rest)
        else:
            self._report(rest, False)

    def _expire(self, evicted: list[int]) -> None:
        """Requests that ended ``SETTLE_S`` ago with no block stored: their keys were never cached."""
        ending = self._ending
        if not ending:
            return
        stale = time.monotonic() - SETTLE_S
        while ending and ending[0][0] < stale:
            ended, s = ending.popleft()
            found = self._sessions.get(s)
            if found is not None and found.ended == ended:
                del self._sessions[s]
                evicted += found.keys


def _hold(block: _Block, keys: list[int]) -> None:
    """``keys`` belong to ``block`` (once each: a head sent again is stored again)."""
    held = block.keys
    for key in keys:
        if key not in held:
            held.append(key)
