"""The router loop's wait for its next timer: zmq_poll counts whole milliseconds, so a wait for a
timer is rounded down and the last fraction turns the loop without sleeping. A batch delay of
200 µs then fires after 200 µs, not after a 1 ms poll (which cost 1.6 ms per request at c=1)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.router_core import RouterCore, write_model

LEVEL = "unit"

W1 = b"worker-1"


def test_a_sub_millisecond_batch_delay_is_not_rounded_up_to_a_poll(tmp_path: Path) -> None:
    write_model(tmp_path, "batched", extra="dynamic_batching { max_queue_delay_microseconds: 200 }\n")
    core = RouterCore(tmp_path)
    try:
        core.serve(W1)
        core.infer("batched")  # one row of a batch of 4: it waits up to 200 µs for more
        later_tick = time.monotonic() + 1.0
        due = core.router.dispatcher.next_timer_ns()
        assert due and due - time.monotonic_ns() < 1_000_000
        assert core.router._poll_timeout_ms(later_tick) == 0  # not 1: the loop turns until it is due
        # With no timer armed, the wait for the next tick is rounded up, as before: never below what was
        # left of it when the router looked (on a busy host, that is less than the 10.5 ms asked).
        core.router.dispatcher._timers.clear()
        before = time.monotonic()
        waited = core.router._poll_timeout_ms(before + 0.0105)
        assert 10.5 - (time.monotonic() - before) * 1000 < waited <= 11
    finally:
        core.close()
