"""ENGINE_PLACEMENT on a real router core (in-process sockets), a vLLM model with two engines: a
prompt's prefix goes back to the engine that has it, new prefixes and round_robin take the engines in
turn, load breaks a prefix's affinity, each engine's load follows its requests to their final
response, the record stays within its bounds under a flood of distinct prompts, and the keys the
ingress computes are shared exactly by prompts (and adapters) that share their head."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from conveyor.deploy import example_repo
from conveyor.ingress import prometheus
from conveyor.ingress.prefix_key import prefix_key
from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.datatypes import serialize_bytes
from conveyor.proto.prefix_keys import MAX_PREFIX_BLOCKS, PREFIX_BLOCK_BYTES, session_key
from conveyor.router.models import InstanceState, VersionState
from conveyor.router.scheduling import engine_placement
from conveyor.router.scheduling.engine_placement import MAX_PREFIX_KEYS, MAX_SESSIONS
from conveyor.router.scheduling.overload import limits_only_change
from conveyor.router.spec.engine_placement import placement_problem
from tests.support.router_core import RouterCore

LEVEL = "unit"

W1 = b"worker-1"

CONFIG = """
name: "{name}"
backend: "vllm"
model_transaction_policy {{ decoupled: true }}
input [{{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }}]
output [{{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }}]
instance_group [{{ count: 2 kind: KIND_MODEL }}]
{extra}
"""


def _write(repo: Path, name: str, extra: str = "") -> None:
    example_repo.write_model(repo, name, CONFIG.format(name=name, extra=extra), {"model.json": "{}"})


_sent: list[m.ExecBatch] = []  # each request's batch, until _finish_all answers it


@pytest.fixture
def core(tmp_path: Path) -> Iterator[RouterCore]:
    _write(tmp_path, "prefix")
    _write(tmp_path, "turns", 'parameters { key: "ENGINE_PLACEMENT" value { string_value: "round_robin" } }')
    c = RouterCore(tmp_path)
    c.serve(W1)
    _sent.clear()  # batches another test's core left open: their ids would name this core's batches
    yield c
    c.close()


_ids = iter(range(1, 1 << 30))


def _send(core: RouterCore, model: str, prefix: list[int], session: str = "") -> int:
    """A request whose prompt has these keys (of this session); the engine (instance index) it was sent to."""
    tensor = m.TensorRef("text_input", "BYTES", [1], "conveyor.test.ingress", 0, 8)
    core.from_ingress(m.InferRequest(next(_ids), model, "", [tensor], [], prefix=prefix,
                                     session=session_key(session) if session else 0))
    (batch,) = core.batches(W1)
    core.from_worker(W1, m.BatchResult(batch.batch, [m.ItemResult(batch.items[0].id, pending=True)]))
    _sent.append(batch)
    return batch.instance



def _finish_all(core: RouterCore) -> None:
    for batch in _sent:
        core.from_worker(W1, m.ItemResponse(batch.batch, 0, final=True))
    _sent.clear()


def _state(core: RouterCore, model: str) -> VersionState:
    return core.router.registry.resolve(model, "")


def test_a_prefix_goes_back_to_its_engine_and_new_ones_spread(core: RouterCore) -> None:
    system_a, system_b = [11, 12, 13], [21, 22, 23]
    first_a = _send(core, "prefix", [*system_a, 100])
    _finish_all(core)
    first_b = _send(core, "prefix", [*system_b, 200])
    _finish_all(core)
    assert first_a != first_b  # nothing cached anywhere: each new prefix to the next engine
    for turn in range(6):
        assert _send(core, "prefix", [*system_a, 1000 + turn]) == first_a
        _finish_all(core)
        assert _send(core, "prefix", [*system_b, 2000 + turn]) == first_b
        _finish_all(core)


def test_round_robin_is_blind_to_prefixes(core: RouterCore) -> None:
    engines = [_send(core, "turns", [1, 2, 3]) for _ in range(4)]
    _finish_all(core)
    assert engines[0] != engines[1] and engines[0] == engines[2] and engines[1] == engines[3]


def test_imbalance_breaks_affinity_and_load_follows_requests_to_their_responses(
        core: RouterCore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_placement, "BALANCE_REQUESTS", 3)
    shared = list(range(1, 9))  # an 8-block head
    home = _send(core, "prefix", [*shared, 99])
    engines = {inst.index: inst for inst in _state(core, "prefix").instances}
    busy = engines[home]
    (idle,) = set(engines) - {home}  # indices are the router's, in the order its loads finish
    assert busy.open_requests == 1 and busy.prefill_blocks == 9  # nothing cached: all 9 blocks to compute
    core.from_worker(W1, m.ItemResponse(_sent[-1].batch, 0, final=False))  # its first token: prompt computed
    assert busy.open_requests == 1 and busy.prefill_blocks == 0
    # Turns of the same head go home until it runs BALANCE_REQUESTS more requests than the idle engine.
    places = [_send(core, "prefix", [*shared, 500 + i]) for i in range(4)]
    assert places[:3] == [home, home, idle], places
    assert busy.open_requests == 3 and busy.prefill_blocks == 2  # one uncached block each
    _finish_all(core)
    assert all(inst.open_requests == 0 and inst.prefill_blocks == 0 for inst in engines.values())


def test_a_prompt_that_shares_little_goes_to_the_least_loaded_engine(core: RouterCore) -> None:
    home = _send(core, "prefix", [1, 2, 3, 4])  # left running: its engine is the busier
    assert _send(core, "prefix", [1, 70, 71, 72, 73]) != home  # a quarter of it cached: under CACHE_SHARE
    assert _send(core, "prefix", [1, 2, 3, 80]) == home  # three quarters: the cache decides
    _finish_all(core)


def test_the_record_stays_bounded_under_distinct_prompts(core: RouterCore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_placement, "MAX_PREFIX_KEYS", 256)
    placement = _state(core, "prefix").placement
    assert placement is not None
    for i in range(40):
        _send(core, "prefix", [i * 1000 + b for b in range(MAX_PREFIX_BLOCKS)])  # 64 new keys each
        _finish_all(core)
        assert len(placement.where) <= 256
    assert MAX_PREFIX_KEYS == 1 << 16  # the module's own bound, unchanged by the test's patch


def test_expired_keys_neither_place_nor_stay(core: RouterCore, monkeypatch: pytest.MonkeyPatch) -> None:
    placement = _state(core, "prefix").placement
    assert placement is not None
    home = _send(core, "prefix", [5, 6, 7])
    _finish_all(core)
    monkeypatch.setattr(engine_placement, "PREFIX_TTL_S", 0.0)
    places = {_send(core, "prefix", [5, 6, 7]) for _ in range(2)}  # the record is stale: they spread
    _finish_all(core)
    assert len(places) == 2 and home in places
    _send(core, "prefix", [9])  # as many expired ones go as keys come in
    assert len(placement.where) <= 4


def test_a_head_its_engine_evicted_goes_where_the_load_says(core: RouterCore) -> None:
    """The engine's KV-cache events (through its worker): the record forgets the keys it evicted, only for
    that engine; a request with that head then goes to the less loaded engine, not back to it."""
    state = _state(core, "prefix")
    placement = state.placement
    assert placement is not None
    system, other = [31, 32, 33, 34], [41, 42, 43, 44]
    home = _send(core, "prefix", system)
    _finish_all(core)
    away = _send(core, "prefix", other)
    assert away != home
    _finish_all(core)
    engines = {inst.index: inst for inst in state.instances}
    busy = _send(core, "prefix", [*system, 99])  # left running: the head's engine is the busier
    assert busy == home
    core.from_worker(W1, m.PrefixesEvicted("prefix", "1", away, other))  # its own head
    core.from_worker(W1, m.PrefixesEvicted("prefix", "1", away, system))  # not recorded there: nothing
    assert _send(core, "prefix", [*system, 98]) == home  # still held there: the cache decides
    core.from_worker(W1, m.PrefixesEvicted("prefix", "1", home, system[2:]))  # its tail: half still held
    assert _send(core, "prefix", system) == home
    core.from_worker(W1, m.PrefixesEvicted("prefix", "1", home, system))
    assert _send(core, "prefix", system) == away  # nothing cached: the less loaded engine
    assert placement.evictions == {engines[away].name: 4, engines[home].name: 2 + 4}
    _finish_all(core)


def test_a_cleared_cache_or_a_new_engine_forgets_all_it_was_sent(core: RouterCore) -> None:
    state = _state(core, "prefix")
    placement = state.placement
    assert placement is not None
    home = _send(core, "prefix", [51, 52, 53])
    _finish_all(core)
    core.from_worker(W1, m.PrefixesEvicted("prefix", "1", home, everything=True))
    assert placement.where == {}
    home = _send(core, "prefix", [61, 62, 63])
    _finish_all(core)
    core.from_worker(W1, m.ModelLoaded("prefix", "1", home))  # its engine started again: an empty cache
    assert placement.where == {}
    snapshot = core.router.control.metrics()
    assert sum(snapshot["prefix_evictions"]["prefix:1"].values()) == 6


def test_while_every_engine_reports_its_evictions_a_key_stays_past_the_guess(
        core: RouterCore, monkeypatch: pytest.MonkeyPatch) -> None:
    """PREFIX_TTL_S is a guess at when an engine evicts; engines that say it themselves are trusted up to
    REPORTED_PREFIX_TTL_S, only while every engine of the model does."""
    state = _state(core, "prefix")
    placement = state.placement
    assert placement is not None and not placement.reported
    for inst in state.instances:  # each engine loaded (again) with its events on
        core.from_worker(W1, m.ModelLoaded("prefix", "1", inst.index, reports_evictions=True))
    assert placement.reported
    home = _send(core, "prefix", [71, 72, 73])
    _finish_all(core)
    monkeypatch.setattr(engine_placement, "PREFIX_TTL_S", 0.0)
    assert {_send(core, "prefix", [71, 72, 73]) for _ in range(3)} == {home}  # still there, by the engines' word
    _finish_all(core)
    (other,) = [inst for inst in state.instances if inst.index != home]
    core.from_worker(W1, m.ModelLoaded("prefix", "1", other.index))  # the other engine, now without events
    assert not placement.reported
    assert all(key in placement.where for key in (71, 72, 73))  # still recorded, and now stale:
    for key in (81, 82):
        _send(core, "prefix", [key])  # as many expired ones go as keys come in
    assert all(key not in placement.where for key in (71, 72, 73))
    _finish_all(core)


def test_a_bad_placement_refuses_the_load_and_the_choice_changes_in_place() -> None:
    config = mc.ModelConfig(name="m", backend="vllm")
    assert placement_problem(config) == ""
    config.parameters["ENGINE_PLACEMENT"].string_value = "prefix"
    assert placement_problem(config) == ""
    config.parameters["ENGINE_PLACEMENT"].string_value = "random"
    assert placement_problem(config) == (
        "parameter 'ENGINE_PLACEMENT' must be one of 'prefix', 'round_robin', got 'random'")
    # A reload that changes only the placement applies in place: the engines (and their caches) stay.
    config.parameters["ENGINE_PLACEMENT"].string_value = "prefix"
    other = mc.ModelConfig()
    other.CopyFrom(config)
    other.parameters["ENGINE_PLACEMENT"].string_value = "round_robin"
    assert limits_only_change(config, other)


# --- sessions (x-session-id, prompt_cache_key) ------------------------------------------------


def _counted(core: RouterCore, model: str = "prefix") -> dict[str, int]:
    """The session outcomes on /metrics' snapshot, summed over the engines."""
    total = dict.fromkeys(("hit", "miss", "new"), 0)
    for outcomes in core.router.control.metrics().get("session_placements", {}).get(f"{model}:1", {}).values():
        for outcome, count in outcomes.items():
            total[outcome] += count
    return total


def test_a_sessions_turns_stay_on_one_engine_whatever_their_prompts(core: RouterCore) -> None:
    """Three sessions (odd: the engines in turn would split each one's turns), every turn a prompt of its own
    (no shared head): each session's turns on the engine of its first, and the sessions spread."""
    homes: dict[str, set[int]] = {}
    for turn in range(4):
        for s in ("a", "b", "c"):
            homes.setdefault(s, set()).add(_send(core, "prefix", [turn * 100 + ord(s)], session=s))
            _finish_all(core)
    assert all(len(engines) == 1 for engines in homes.values()), homes
    assert len(set.union(*homes.values())) == 2, homes  # new sessions spread as new prefixes do
    assert _counted(core) == {"hit": 9, "miss": 0, "new": 3}
    rows = [line.rsplit(" ", 1) for line in prometheus.render(core.router.control.metrics()).splitlines()
            if line.startswith("conveyor_engine_session_placements_total{")]
    names = sorted(inst.name for inst in _state(core, "prefix").instances)
    assert [key for key, _ in rows] == [
        f'conveyor_engine_session_placements_total{{engine="{name}",model="prefix",outcome="{outcome}",version="1"}}'
        for name in names for outcome in ("hit", "miss", "new")]  # every outcome of each engine, the other model's none
    assert sum(float(n) for key, n in rows if 'outcome="hit"' in key) == 9
    # Without a session the same order splits the turns: what keeps them together is the key.
    spread = {_send(core, "prefix", [9000 + turn]) for turn in range(3)}
    _finish_all(core)
    assert len(spread) == 2


def test_a_session_outweighs_a_prefix_held_elsewhere(core: RouterCore) -> None:
    away = _send(core, "prefix", [1, 2, 3, 4])
    _finish_all(core)
    home = _send(core, "prefix", [50], session="agent")
    _finish_all(core)
    assert home != away
    assert _send(core, "prefix", [1, 2, 3, 4], session="agent") == home  # its history is there
    _finish_all(core)


def test_a_session_leaves_an_engine_that_is_not_ready_and_stays_where_it_went(core: RouterCore) -> None:
    state = _state(core, "prefix")
    home = _send(core, "prefix", [], session="s1")
    _finish_all(core)
    engine = next(inst for inst in state.instances if inst.index == home)
    engine.state = InstanceState.LOADING  # as while its worker is replaced
    try:
        moved = _send(core, "prefix", [], session="s1")
        _finish_all(core)
    finally:
        engine.state = InstanceState.READY
    assert moved != home
    assert [_send(core, "prefix", [], session="s1") for _ in range(3)] == [moved] * 3  # together there
    _finish_all(core)
    assert _counted(core) == {"hit": 3, "miss": 1, "new": 1}


def test_a_session_leaves_an_engine_out_of_balance(core: RouterCore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_placement, "BALANCE_REQUESTS", 3)
    home = _send(core, "prefix", [], session="busy")  # each left running: its engine loads up
    places = [_send(core, "prefix", [], session="busy") for _ in range(3)]
    # Home runs 3 more than the idle engine after the second: the third goes there, and the session with it.
    assert places == [home, home, places[2]] and places[2] != home, (home, places)
    _finish_all(core)
    assert _send(core, "prefix", [], session="busy") == places[2]
    _finish_all(core)
    assert _counted(core) == {"hit": 3, "miss": 1, "new": 1}


def test_a_new_engine_drops_its_sessions_which_are_placed_anew(core: RouterCore) -> None:
    placement = _state(core, "prefix").placement
    assert placement is not None
    home = _send(core, "prefix", [], session="s")
    _finish_all(core)
    core.from_worker(W1, m.ModelLoaded("prefix", "1", home))  # its engine started again: the history is gone
    assert placement.sessions == {}
    _send(core, "prefix", [], session="s")
    _finish_all(core)
    assert _counted(core) == {"hit": 0, "miss": 0, "new": 2}


def test_the_session_record_stays_bounded(core: RouterCore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_placement, "MAX_SESSIONS", 8)
    placement = _state(core, "prefix").placement
    assert placement is not None
    for i in range(20):
        _send(core, "prefix", [], session=f"s{i}")
        _finish_all(core)
        assert len(placement.sessions) <= 8
    _send(core, "prefix", [], session="s19")  # the most recent: still recorded
    _send(core, "prefix", [], session="s0")  # the least recent: pushed out, a new session again
    _finish_all(core)
    assert _counted(core) == {"hit": 1, "miss": 0, "new": 21}
    assert MAX_SESSIONS == 1 << 15  # the module's own bound, unchanged by the test's patch


def test_round_robin_is_blind_to_sessions(core: RouterCore) -> None:
    engines = [_send(core, "turns", [], session="s") for _ in range(2)]
    _finish_all(core)
    assert engines[0] != engines[1]
    assert "turns:1" not in core.router.control.metrics()["session_placements"]  # nor counted


def test_a_session_keys_hash_is_stable_and_never_none() -> None:
    assert session_key("agent-1") == session_key("agent-1") != session_key("agent-2")
    for key in ("", "x", "\udcff", "k" * 10_000):
        assert 0 < session_key(key) < 1 << 63  # msgpack's signed range; 0 is "no session"


# --- the ingress's keys ---------------------------------------------------------------------


def _keys(prompt: str, adapter: str = "", in_sampling: bool = False) -> list[int]:
    arena = bytearray()
    refs = []
    values = {"text_input": prompt.encode()}
    if adapter and in_sampling:
        values["sampling_parameters"] = json.dumps({"temperature": 0, "lora_name": adapter}).encode()
    for name, value in values.items():
        data = serialize_bytes(np.array([value], dtype=object))
        refs.append(m.TensorRef(name, "BYTES", [1], "arena", len(arena), len(data)))
        arena += data
    buf = np.frombuffer(bytes(arena), dtype=np.uint8)
    params = {"lora_name": adapter} if adapter and not in_sampling else {}
    return prefix_key(refs, lambda offset, nbytes: buf[offset:offset + nbytes], params)


def test_prompts_that_share_a_head_share_its_keys() -> None:
    head = "You are a helpful assistant. " * 10  # 290 bytes: 4 whole blocks
    a, b = _keys(head + "What is the capital of France?"), _keys(head + "Write a haiku about the sea.")
    shared = len(head) // PREFIX_BLOCK_BYTES
    assert a[:shared] == b[:shared] and a[shared:] != b[shared:]
    assert len(a) == len(head + "What is the capital of France?") // PREFIX_BLOCK_BYTES
    assert _keys("short prompt") == []  # not one whole block: nothing an engine would cache
    # Another adapter's blocks are other blocks, wherever the request names it.
    assert _keys(head, "alpha")[0] != _keys(head)[0]
    assert _keys(head, "alpha") == _keys(head, "alpha", in_sampling=True)


def test_a_long_prompt_has_at_most_max_prefix_blocks_keys() -> None:
    assert len(_keys("x" * (PREFIX_BLOCK_BYTES * (MAX_PREFIX_BLOCKS + 50)))) == MAX_PREFIX_BLOCKS


def test_a_tokenized_prompt_is_keyed_by_its_ids() -> None:
    ids = np.arange(100, 100 + 40, dtype=np.int32)  # 40 ids: two whole blocks of 16
    other = ids.copy()
    other[-1] = 7  # differs in the third, partial block only
    keys = []
    for tokens in (ids, other):
        arena = serialize_bytes(np.array([b""], dtype=object)) + tokens.tobytes()
        refs = [m.TensorRef("text_input", "BYTES", [1], "arena", 0, 4),
                m.TensorRef("input_ids", "INT32", [len(tokens)], "arena", 4, tokens.nbytes)]
        buf = np.frombuffer(arena, dtype=np.uint8)

        def view(offset: int, nbytes: int, buf: np.ndarray = buf) -> np.ndarray:
            return buf[offset:offset + nbytes]

        keys.append(prefix_key(refs, view, {}))
    assert len(keys[0]) == 2 and keys[0] == keys[1]
