"""Which engine of a model runs a request, when the model has several (``ENGINE_PLACEMENT``).

A vLLM model with ``instance_group [ { count: N } ]`` (or one instance per worker) runs N engines,
each with its own KV cache. A prompt's blocks are cached on the engine that computed them, so a
request whose prompt starts as an earlier one's is cheapest on that engine: its prefix is not
computed again, and the other engines' caches keep room for other prefixes. ``prefix`` (the
default) places each request where that saves the most work, balanced against load; ``round_robin``
takes the engines in turn, blind to prompts::

    parameters { key: "ENGINE_PLACEMENT" value: { string_value: "round_robin" } }

The prefix rule is the cache-aware policy of SGLang's router (sgl-router), on the router's own
record: while the engines' loads are near each other, a request goes to the engine that holds the
longest prefix of its prompt, provided that covers at least ``CACHE_SHARE`` of the prompt's keyed
blocks; a request that shares less goes to the least loaded engine (fewest requests sent and not
finally answered, then fewest prompt blocks still to compute, then each engine in turn, so new
prefixes spread). Once one engine runs ``BALANCE_REQUESTS`` more requests than another and
``BALANCE_RATIO`` times as many, every request goes to the least loaded until they are near again:
a hot prefix does not pile onto one engine without bound. (A cost in blocks, as NVIDIA Dynamo's
KV-aware router weighs them, lost most turns' affinity with four clients on two engines here: a
prompt's prefill costs little next to an engine step, so load measured in blocks overweighs it.)
Prompts are keyed by the ingress (proto/prefix_keys.py); the record keeps each key's last engine
for ``PREFIX_TTL_S`` and at most ``MAX_PREFIX_KEYS`` keys, oldest out first, as an engine's cache
evicts what is least recently used. Where the engines publish their KV-cache events, each worker says
which keys its engine evicted (workers/backends/vllm/cached_prefixes.py): those leave the record at
once (``evicted``), and a request whose head its engine no longer holds goes where the load says;
while every engine of the model reports so, the record keeps a key until its engine evicts it, up to
``REPORTED_PREFIX_TTL_S`` (``trust``). An engine that starts again (its worker replaced) starts with an
empty cache, and its keys go too.

A request may name its session (the ingress's hash of ``x-session-id`` or OpenAI's ``prompt_cache_key``,
proto/prefix_keys.py): an agent's or a chat's turns, each of which resends the history its previous turn's
engine holds. Under ``prefix`` placement it goes to the engine that ran the session's previous turn while
that engine can take a request now (ready, within its rate limits) and is not out of balance with the least
loaded one (as above); otherwise it is placed by prefix and load, and the session stays with the engine it
went to. The record keeps each session's engine, at most ``MAX_SESSIONS``, the least recently used out
first; an engine that starts again (or whose cache was cleared) drops its sessions, whose next turns are
placed anew and stay together there. ``sessions_counted`` counts each session request's outcome by engine:
``hit`` (its previous turn's engine), ``miss`` (moved: that engine was not ready or too loaded), ``new`` (a
session not in the record).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_text
from conveyor.router.spec.engine_placement import PARAMETER, PREFIX, ROUND_ROBIN

if TYPE_CHECKING:
    from conveyor.router.models import Instance
    from conveyor.router.pending import Pending

# A key unseen this long is taken to be evicted from its engine's cache. Engines evict by memory,
# not time: under a steady load a busy engine's cache turns over in about this time on small hosts,
# and a wrong guess costs a placement no better than round-robin, never a wrong answer.
PREFIX_TTL_S = 300.0
# The same, while every engine of the model says what it evicts (KV-cache events): a head idle for longer
# (a chat's next turn after a pause, a system prompt used now and then) is still where it was until its
# engine evicts it. Bounded all the same: an engine whose events stop without a gap being seen.
REPORTED_PREFIX_TTL_S = 3600.0
# Keys remembered per model version (~100 bytes each: ~6 MiB at most): 64 keys per request
# (proto/prefix_keys.MAX_PREFIX_BLOCKS), so about a thousand distinct 4 KiB prompt heads. A key
# pushed out only makes its next request's placement blind to it.
MAX_PREFIX_KEYS = 1 << 16
# A request whose cached head is at least this share of its keyed prompt goes to that engine (SGLang's
# cache_threshold): below it the saving is small next to an engine's queue, and load decides.
CACHE_SHARE = 0.5
# Engines this far apart in requests (both more and BALANCE_RATIO times as many) are out of balance:
# the load decides until they are near again. SGLang's router uses 32 and 1.5 for GPU engines;
# a CPU engine runs far fewer sequences at once (max_num_seqs 32 here).
BALANCE_REQUESTS = 16
BALANCE_RATIO = 1.5
# Sessions remembered per model version (~200 bytes each: ~6 MiB at most), the least recently used out
# first: a session pushed out only has its next turn placed by prefix and load, and recorded again.
MAX_SESSIONS = 1 << 15
# ``sessions_counted``'s outcomes, each shown on /metrics (conveyor_engine_session_placements_total).
SESSION_OUTCOMES = ("hit", "miss", "new")


class EnginePlacement:
    """One model version's placement across its engines, and its record of the prefixes and sessions sent."""

    __slots__ = ("_turn", "by_prefix", "evictions", "reported", "sessions", "sessions_counted", "where")

    def __init__(self, by_prefix: bool) -> None:
        self.by_prefix = by_prefix
        # Prefix key -> (the engine it was last sent to, when), least recently sent first.
        self.where: dict[int, tuple[Instance, int]] = {}
        self._turn = itertools.count()
        # Keys taken out of the record because their engine evicted them, by the engine's name (/metrics).
        self.evictions: dict[str, int] = {}
        self.reported = False  # every engine says what it evicts (``trust``)
        # Session hash -> the engine of its latest turn, least recently sent first.
        self.sessions: dict[int, Instance] = {}
        # Session requests by the engine they went to and their outcome (``SESSION_OUTCOMES``), for /metrics.
        self.sessions_counted: dict[str, dict[str, int]] = {}

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> EnginePlacement:
        return cls((parameter_text(config, PARAMETER) or PREFIX) != ROUND_ROBIN)

    def choose(self, engines: Sequence[Instance], item: Pending) -> Instance:
        """The engine of ``engines`` (those that can take a request now: two or more) for ``item``;
        sets the item's ``prefill_blocks`` (the blocks that engine computes for it, by the record)."""
        n = len(engines)
        start = next(self._turn) % n
        keys = item.request.prefix
        if not self.by_prefix:
            item.prefill_blocks = len(keys)
            return engines[start]
        matched = self._matched(keys) if keys else {}
        rotated = [engines[(start + i) % n] for i in range(n)]
        least = min(rotated, key=_load)
        best = least
        session = item.request.session
        held = self.sessions.get(session) if session else None
        if held is not None and held in engines and not _ahead(held, least):
            best = held  # the session's previous turn's engine: its history is cached there
        elif matched and not _out_of_balance(engines):
            cached = max(rotated, key=lambda e: (matched.get(id(e), 0), -e.open_requests))
            if matched.get(id(cached), 0) >= CACHE_SHARE * len(keys):
                best = cached
        item.prefill_blocks = len(keys) - matched.get(id(best), 0)
        return best

    def sent(self, engine: Instance, item: Pending) -> None:
        """``item`` went to ``engine``: its prefix is there now, and its session's turns go there next."""
        if not self.by_prefix:
            return
        session = item.request.session
        if session:
            self._session_sent(session, engine)
        keys = item.request.prefix
        if not keys:
            return
        where = self.where
        now = time.monotonic_ns()
        stale = now - int(self._ttl_s() * 1e9)
        expired: list[int] = []
        for key, (_, seen) in where.items():  # the oldest first: as many expired ones out as come in
            if seen >= stale or len(expired) > len(keys):
                break
            expired.append(key)
        for key in expired:
            del where[key]
        for key in keys:
            where.pop(key, None)  # re-inserted last: the most recently sent
            where[key] = (engine, now)
        if len(where) > MAX_PREFIX_KEYS:
            for key in list(itertools.islice(where, len(where) - MAX_PREFIX_KEYS)):
                del where[key]

    def _session_sent(self, session: int, engine: Instance) -> None:
        sessions = self.sessions
        held = sessions.pop(session, None)  # re-inserted last: the most recently used
        sessions[session] = engine
        if len(sessions) > MAX_SESSIONS:
            del sessions[next(iter(sessions))]
        outcome = "new" if held is None else "hit" if held is engine else "miss"
        counted = self.sessions_counted.setdefault(engine.name, dict.fromkeys(SESSION_OUTCOMES, 0))
        counted[outcome] += 1

    def evicted(self, engine: Instance, keys: list[int]) -> None:
        """``engine`` evicted the blocks of ``keys``: those it was recorded for leave the record."""
        where = self.where
        gone = 0
        for key in keys:
            seen = where.get(key)
            if seen is not None and seen[0] is engine:
                del where[key]
                gone += 1
        if gone:
            self.evictions[engine.name] = self.evictions.get(engine.name, 0) + gone

    def trust(self, engines: Sequence[Instance]) -> None:
        """How long a key is taken to stay in its engine's cache: until it is evicted (within
        ``REPORTED_PREFIX_TTL_S``) while every engine says what it evicts, else ``PREFIX_TTL_S``."""
        self.reported = bool(engines) and all(e.reports_evictions for e in engines)

    def _ttl_s(self) -> float:
        return REPORTED_PREFIX_TTL_S if self.reported else PREFIX_TTL_S

    def forget(self, engine: Instance) -> None:
        """``engine`` holds nothing it was sent (a new engine, a cleared cache, lost events)."""
        where = self.where
        keys = [key for key, (held, _) in where.items() if held is engine]
        for key in keys:
            del where[key]
        if keys:
            self.evictions[engine.name] = self.evictions.get(engine.name, 0) + len(keys)
        # Its sessions' history is gone with its cache: their next turns are placed anew (and stay there).
        sessions = self.sessions
        for session in [session for session, held in sessions.items() if held is engine]:
            del sessions[session]

    def _matched(self, keys: list[int]) -> dict[int, int]:
        """``id()`` of each engine -> how many of the prompt's leading blocks it holds, by the record."""
        where = self.where
        stale = time.monotonic_ns() - int(self._ttl_s() * 1e9)
        matched: dict[int, int] = {}
        for i, key in enumerate(keys, 1):
            seen = where.get(key)
            if seen is not None and seen[1] >= stale:
                matched[id(seen[0])] = i  # keys are chained: key i stands for the whole prefix up to it
        return matched


def _load(engine: Instance) -> tuple[int, int]:
    return engine.open_requests, engine.prefill_blocks


def _ahead(engine: Instance, least: Instance) -> bool:
    """``engine`` runs so many more requests than ``least`` that they are out of balance (as ``_out_of_balance``)."""
    high, low = engine.open_requests, least.open_requests
    return high - low >= BALANCE_REQUESTS and high >= BALANCE_RATIO * low


def _out_of_balance(engines: Sequence[Instance]) -> bool:
    loads = [e.open_requests for e in engines]
    low, high = min(loads), max(loads)
    return high - low >= BALANCE_REQUESTS and high >= BALANCE_RATIO * low
