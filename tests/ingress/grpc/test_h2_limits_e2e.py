"""Each HTTP/2 limit of the gRPC ingress meets its attack on a real group.

One loopback connection misbehaves for a short, bounded time (``tests/support/h2_attacks.py``)
while a tritonclient gRPC client calls ``simple`` every 20 ms on another. Each test checks
what the attacker was answered, that the other client was served all along, that the
ingress process's RSS stayed bounded, and that it is idle again soon after (its CPU time
stops growing). Every attack meets each HTTP/2 engine: the group's own gRPC ingress
(``conveyor serve`` defaults: ngh2) and an extra ingress of the group on the other one
(``--grpc-server h2``); the buffer budgets' attacks go to an extra ingress started with
small budgets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import pytest

from conveyor.deploy.options import AUTO_GRPC_SERVER
from conveyor.ingress.grpc.h2_server import limits
from conveyor.ingress.grpc.h2_server.engine import ENGINES
from tests.support import h2_attacks as h2a
from tests.support import h2_watch as h2w
from tests.support.extra_ingress import extra_grpc_ingress_process
from tests.support.group import Server, pids_of

LEVEL = "e2e"

ATTACK_S = 2.5  # each attack's longest run; most end sooner, with the server's GOAWAY
VICTIM_S = 1.0  # the other client is measured at least this long (some 50 calls)
RSS_GROWTH = 64 << 20  # what an attack may add to the ingress's resident memory
IDLE_WITHIN_S = 10.0
MIN_VICTIM_CALLS = 5  # of ~50 at 50 per second: the machine may be busy, the server must not be stuck


@dataclass
class Target:
    url: str
    port: int
    pid: int
    engine: str = "h2"


@dataclass
class Result:
    outcome: h2a.Outcome
    victim: h2w.Victim
    watch: h2w.IngressWatch
    idle_after_s: float | None

    def check_contained(self) -> None:
        """The other client served, memory bounded, the ingress idle again."""
        v = self.victim
        assert v.failed == 0 and v.ok >= MIN_VICTIM_CALLS, (v.ok, v.failed, v.errors)
        assert self.watch.rss_growth < RSS_GROWTH, self.watch.rss_growth
        assert self.idle_after_s is not None, "the ingress was still busy after the attack"


def attacked(target: Target, attack: Callable[[int], h2a.Outcome], victim_url: str | None = None) -> Result:
    with h2w.IngressWatch(target.pid) as watch:
        with h2w.Victim(victim_url or target.url) as victim:
            started = time.monotonic()
            outcome = attack(target.port)
            time.sleep(max(0.0, VICTIM_S - (time.monotonic() - started)))
        idle = watch.wait_idle(IDLE_WITHIN_S)
    return Result(outcome, victim, watch, idle)


@pytest.fixture(scope="module")
def own(server: Server) -> Target:
    """The group's own gRPC ingress (--grpc-server auto: AUTO_GRPC_SERVER)."""
    (pid,) = pids_of(server, "ingress-grpc")
    return Target(server.grpc_url, server.grpc_port, pid, AUTO_GRPC_SERVER)


@pytest.fixture(scope="module", params=ENGINES)
def target(request: pytest.FixtureRequest, server: Server, own: Target) -> Iterator[Target]:
    """The gRPC ingress on each HTTP/2 engine: the group's own for the default one, else an extra."""
    if request.param == own.engine:
        yield own
        return
    with extra_grpc_ingress_process(server, "--grpc-server", request.param) as (url, pid):
        yield Target(url, int(url.rsplit(":", 1)[1]), pid, request.param)


def test_streams_past_the_concurrency_limit_are_refused(target: Target) -> None:
    # HEADERS on ModelStreamInfer that never send a message, 200 per write.
    r = attacked(target, lambda port: h2a.open_streams(port, ATTACK_S, limit=10_000))
    if target.engine == "ngh2":
        # nghttp2 ends the connection at the first stream past the limit the client acknowledged.
        assert r.outcome.goaway == h2a.PROTOCOL_ERROR
    else:
        # Refusals spend the reset budget: a client that keeps opening streams is cut off.
        assert 0 < r.outcome.refused <= limits.RESET_BURST + 100
        assert r.outcome.goaway == h2a.ENHANCE_YOUR_CALM
    r.check_contained()


def test_rapid_reset_ends_in_enhance_your_calm(target: Target) -> None:
    # HEADERS + RST_STREAM on ModelStreamInfer, 200 per write (CVE-2023-44487).
    r = attacked(target, lambda port: h2a.rapid_reset(port, ATTACK_S, limit=20_000))
    assert r.outcome.goaway == h2a.ENHANCE_YOUR_CALM
    assert r.outcome.closed
    r.check_contained()


def test_continuation_frames_past_the_cap_end_the_connection(target: Target) -> None:
    # HEADERS without END_HEADERS, then empty CONTINUATION frames, 1000 per write.
    r = attacked(target, lambda port: h2a.continuation_flood(port, ATTACK_S, limit=100_000))
    # nghttp2 calls it a flood (CVE-2024-28182): the server's GOAWAY says ENHANCE_YOUR_CALM.
    assert r.outcome.goaway == {"h2": h2a.PROTOCOL_ERROR, "ngh2": h2a.ENHANCE_YOUR_CALM}[target.engine]
    assert r.outcome.closed
    r.check_contained()


def test_ping_and_settings_floods_end_in_enhance_your_calm(target: Target) -> None:
    for kind in ("ping", "settings"):
        r = attacked(target, partial(flood, kind))
        assert r.outcome.goaway == h2a.ENHANCE_YOUR_CALM, kind
        r.check_contained()


def flood(kind: str, port: int) -> h2a.Outcome:
    return h2a.control_flood(port, ATTACK_S, kind, limit=20_000, read=True)


def test_pings_from_a_peer_that_does_not_read_are_cut_off(target: Target) -> None:
    # The answers the server owes it stay bounded, and the flood is cut off (the connection,
    # which cannot take its GOAWAY, is aborted CLOSE_TIMEOUT_S later).
    r = attacked(target, lambda port: h2a.control_flood(port, ATTACK_S, "ping", limit=20_000))
    r.check_contained()


def test_a_peer_that_does_not_read_is_paused(target: Target) -> None:
    # Large answers to a peer that gave large windows and reads none: the server stops reading.
    r = attacked(target, lambda port: h2a.unread_responses(port, ATTACK_S + 2, limit=400))
    assert r.outcome.stalled and r.outcome.sent < 400
    r.check_contained()


def test_data_past_the_window_is_a_flow_control_error(target: Target) -> None:
    # ModelStreamInfer requests sent on although the server stopped crediting the stream.
    r = attacked(target, lambda port: h2a.window_overrun(port, ATTACK_S + 4, limit=60_000))
    assert r.outcome.goaway == h2a.FLOW_CONTROL_ERROR
    r.check_contained()


def test_a_header_list_over_the_limit_ends_the_connection(target: Target) -> None:
    r = attacked(target, lambda port: h2a.oversized_headers(port, ATTACK_S, limit=20))
    assert r.outcome.goaway == h2a.ENHANCE_YOUR_CALM
    r.check_contained()


def test_a_declared_length_allocates_nothing(target: Target) -> None:
    # ModelInfer calls declaring 60 MiB messages and sending their 5-byte prefix, 200 per write.
    r = attacked(target, lambda port: h2a.declared_length(port, ATTACK_S, limit=2_000))
    if target.engine == "ngh2":  # past the streams a connection may have (see the concurrency test)
        assert r.outcome.goaway == h2a.PROTOCOL_ERROR
    else:
        assert r.outcome.refused > 0
    r.check_contained()


@pytest.fixture(scope="module")
def small_budgets(server: Server) -> Iterator[Target]:
    """An extra gRPC ingress of the group whose buffer budgets are 16 MiB per connection and
    32 MiB for the process."""
    with extra_grpc_ingress_process(server, "--grpc-max-connection-buffer-bytes", str(16 << 20),
                                    "--grpc-max-buffer-bytes", str(32 << 20)) as (url, pid):
        yield Target(url, int(url.rsplit(":", 1)[1]), pid)


BUDGET_ATTACK_S = 15.0  # a bound only: the attack ends at the server's first refusal


def test_unfinished_messages_stop_at_the_connection_budget(small_budgets: Target) -> None:
    # One connection, 12 calls that send 2 of the 8 MiB their messages declare and never finish
    # them, keeping to flow control: 24 MiB against the connection's 16 (and the process's 32).
    stop = threading.Event()
    r = attacked(small_budgets, lambda port: h2a.unfinished_messages(
        port, BUDGET_ATTACK_S, streams_n=12, declared=8 << 20, limit_bytes=24 << 20, stop=stop))
    assert r.outcome.statuses and set(r.outcome.statuses) == {"8"}, r.outcome  # RESOURCE_EXHAUSTED
    assert all("--grpc-max-connection-buffer-bytes" in m for m in r.outcome.messages), r.outcome.messages
    r.check_contained()


def test_unfinished_messages_stop_at_the_process_budget(small_budgets: Target, own: Target) -> None:
    # Three such connections, each holding 14 MiB (under its 16) at the same time: 42 MiB against
    # the process's 32. The budget is the process's, so its refusals reach any client of this
    # ingress: the other client calls the group's own gRPC ingress.
    stop = threading.Event()
    outcomes: list[h2a.Outcome] = []

    def three(port: int) -> h2a.Outcome:
        threads = [threading.Thread(target=lambda: outcomes.append(h2a.unfinished_messages(
            port, BUDGET_ATTACK_S, streams_n=12, declared=8 << 20, limit_bytes=14 << 20, stop=stop)))
            for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return outcomes[0]

    r = attacked(small_budgets, three, victim_url=own.url)
    messages = [m for o in outcomes for m in o.messages]
    assert {s for o in outcomes for s in o.statuses} == {"8"}, outcomes
    assert all("--grpc-max-buffer-bytes" in m for m in messages), messages
    r.check_contained()
