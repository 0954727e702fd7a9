"""The dynamic batcher: turns one model version's queue into batches when an
instance is free (Triton's ``dynamic_batching``).

Policy, as Triton's:

* Requests are considered in service order (``PriorityQueues``: priority
  level, then arrival); a batch holds consecutive requests whose batch key
  matches the first one's, up to ``max_batch_size`` rows. The key
  (``router/scheduling/shape_keys.py``) is the non-batch shapes, as in Triton, except
  for ragged inputs (any shape) and padded ones (any length in their
  variable dims: ``conveyor.pad_batching``), whose shapes the worker
  reconciles.
* If a preferred batch size (``preferred_batch_size``; default
  ``max_batch_size``) can be formed, the largest such batch leaves at once;
  so does the batch that the next request would push past the largest
  preferred size (Triton's ``GetDynamicBatch`` marks it as a preferred one:
  a batch of 3 then 4 with preferred [2, 6] runs as 3, the 4 waits its own
  delay).
* Otherwise the batch leaves when it cannot grow (the next request does not
  fit or match, or it reached the largest preferred size), or when its oldest
  request has waited ``max_queue_delay_microseconds``; until then the batcher
  asks to be woken at that time. With no delay configured, whatever is queued
  when an instance frees up goes together — batches grow with load by
  themselves.
* Without dynamic batching every request is its own batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from conveyor.router.pending import Pending
from conveyor.router.scheduling.priority_queues import Expired, PriorityQueues
from conveyor.router.scheduling.queue_policy import DEFAULT_QUEUE_CAP, SchedulingPolicy

if TYPE_CHECKING:
    from conveyor.router.scheduling.adaptive import AdaptiveController


class DynamicBatcher:
    # Set by ``AdaptiveBatcher`` only: the router feeds it each batch's execution time.
    adaptive: AdaptiveController | None = None
    # Nothing leaves until this many requests are queued, once (Triton's TRITONSERVER_DELAY_SCHEDULER
    # test hook: ``delay_hooks.py``); 0 from then on, and in every deployment.
    held_until = 0

    def __init__(
        self,
        max_batch_size: int,
        preferred: list[int],
        max_delay_ns: int,
        enabled: bool,
        policy: SchedulingPolicy | None = None,
        queue_cap: int = DEFAULT_QUEUE_CAP,
    ) -> None:
        self.max_batch_size = max(max_batch_size, 1)
        self.enabled = enabled and max_batch_size > 0
        sizes = {p for p in preferred if 0 < p <= self.max_batch_size} or {self.max_batch_size}
        self.preferred = frozenset(sizes)
        self.max_preferred = max(sizes)
        self.max_delay_ns = max_delay_ns
        self.queues = queues = PriorityQueues(policy or SchedulingPolicy(), queue_cap)
        # The queue's own methods, without a forwarding call on the router's hot path:
        # push raises UNAVAILABLE ("Exceeds maximum queue size") when full; take_expired
        # returns the requests that leave unexecuted, each with its answer.
        self.push: Callable[[Pending], None] = queues.push
        self.pop: Callable[[], Pending] = queues.pop
        self.remove: Callable[[bytes, int], Pending | None] = queues.remove
        self.take_expired: Callable[[int], Expired] = queues.take_expired

    def __len__(self) -> int:
        return self.queues.size  # asked several times per request: not through ``PriorityQueues.__len__``

    @property
    def next_expiry_ns(self) -> int:
        return self.queues.next_expiry_ns

    def head(self) -> Pending | None:
        """The request that leaves next (None if empty)."""
        return next(self.queues.in_order(), None)

    def next_batch(self, now_ns: int) -> list[Pending] | int | None:
        """A batch to run now, or the time (ns) to ask again, or None if empty."""
        queues = self.queues
        if not len(queues):
            return None
        if self.held_until:
            if len(queues) < self.held_until:
                return None  # asked again as each request arrives
            self.held_until = 0
        if not self.enabled:
            return [queues.pop()]
        items = queues.in_order()
        head = next(items)
        rows = head.rows
        count = 1
        best = count if rows in self.preferred else 0  # longest run whose rows are a preferred size
        oldest = head.arrival_ns
        blocked = rows >= self.max_batch_size
        if not blocked:
            for item in items:
                if not best and rows + item.rows > self.max_preferred:
                    best = count  # the batch before it outgrows every preferred size: it leaves as one
                if item.shape_key != head.shape_key or rows + item.rows > self.max_batch_size:
                    blocked = True
                    break
                rows += item.rows
                count += 1
                if item.arrival_ns < oldest:
                    oldest = item.arrival_ns
                if rows in self.preferred:
                    best = count
                if rows >= self.max_batch_size:
                    blocked = True
                    break
        delay = self.max_delay_ns
        waited_enough = delay > 0 and now_ns - oldest >= delay
        if best and not waited_enough:
            return queues.take(best)
        if blocked or rows >= self.max_preferred or not delay or waited_enough:
            return queues.take(count)
        return oldest + delay
