"""A prompt's prefix keys: chained hashes of its leading blocks, the names an ingress, the router and a
vLLM worker share for what an engine's prefix cache holds (docs/LLM.md, "Several engines").

An engine's prefix cache keeps a prompt's KV blocks under the hash of every token up to and in each
block, so a request whose prompt starts as an earlier one's reuses those blocks, on the engine that
ran the earlier one. The router, which never reads tensor bytes, places requests by the same idea
(router/scheduling/engine_placement.py) on keys the ingress computes (ingress/prefix_key.py) while the
prompt is hot in its cache: key ``i`` is the CRC-32 of the adapter's name and the prompt's first
``(i + 1) * PREFIX_BLOCK_BYTES`` bytes. Two prompts share key ``i`` exactly when they share that much
text under the same adapter; a CRC collision costs a worse placement, never a wrong answer. Only
whole blocks, as an engine caches only whole blocks. A vLLM worker computes the same keys for the
requests it runs, to tell the router which ones its engine evicted
(workers/backends/vllm/cached_prefixes.py).

A session key (the ``x-session-id`` header, OpenAI's ``prompt_cache_key``) names an agent's or a chat's
turns: the router keeps them on the engine that ran the session's previous turn, whose cache holds its
history, while that engine is ready and not overloaded. The ingress sends its 63-bit hash (``session_key``).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence

# ~16 tokens of English text: the block size of vLLM's GPU engines, so a key stands for about one
# cached block. (A CPU engine's blocks are larger; the keys are then finer than its blocks, which
# costs nothing but a few keys.)
PREFIX_BLOCK_BYTES = 64
# Keys for the prompt's first 4 KiB at most: the shared head (a system prompt, a document) decides
# where a prompt's blocks are; this bounds the descriptor (~330 bytes of keys) and the router's work
# and record per request.
MAX_PREFIX_BLOCKS = 64
# Bytes of a prompt that are keyed at most.
KEYED_BYTES = MAX_PREFIX_BLOCKS * PREFIX_BLOCK_BYTES
# A tokenized prompt (INT32 ids) is keyed on its ids' bytes: this many ids a key.
IDS_PER_KEY = PREFIX_BLOCK_BYTES // 4


def block_keys(data: bytes | memoryview, adapter: str, media: Sequence[bytes | memoryview] = ()) -> list[int]:
    """The keys of ``data``'s whole blocks (at most ``MAX_PREFIX_BLOCKS``), in order: a prompt's UTF-8
    text, or its INT32 token ids' bytes; ``adapter``: the LoRA adapter's name, "" for the base model;
    ``media``: the request's images as its ``image`` tensor holds them (each element's 4-byte length, then its
    bytes), hashed into every key: the same prompt with another image shares no cached block, with the same
    image it finds its cached prefix."""
    blocks = min(len(data) // PREFIX_BLOCK_BYTES, MAX_PREFIX_BLOCKS)
    h = zlib.crc32(adapter.encode() + b"\0") if adapter else 0
    for part in media:
        h = zlib.crc32(part, h)
    keys = []
    for end in range(PREFIX_BLOCK_BYTES, (blocks + 1) * PREFIX_BLOCK_BYTES, PREFIX_BLOCK_BYTES):
        h = zlib.crc32(data[end - PREFIX_BLOCK_BYTES:end], h)
        keys.append(h)
    return keys


SESSION_HEADER = "x-session-id"  # the header that names a request's session, on the OpenAI and generate routes


def session_key(key: str) -> int:
    """The descriptor's hash of a session key (never 0, which means none). 64 bits, not CRC-32: a
    collision puts two sessions on one engine, and a busy group sees many thousands of sessions."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 1) or 1  # within msgpack's signed range
