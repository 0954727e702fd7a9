"""The queued requests of one model version: one FIFO per priority level, each
with its Triton queue policy (size limit, timeout, REJECT or DELAY).

Service order: level 1 before level 2 ..., and within a level the requests in
arrival order, then those its DELAY policy has set aside (timed out), as
Triton's per-level queues do.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from collections.abc import Iterator
from itertools import chain

from conveyor.proto.errors import ConveyorError, Status, request_prefix, unavailable
from conveyor.router.pending import Pending
from conveyor.router.scheduling.queue_policy import QueuePolicy, SchedulingPolicy

# What a request that leaves the queue unexecuted is answered with.
DEADLINE_PASSED = ConveyorError(Status.DEADLINE_EXCEEDED, "request timeout expired before the model ran it")
QUEUE_TIMEOUT = ConveyorError(Status.UNAVAILABLE, "Request timeout expired")  # Triton's REJECT wording

Expired = list[tuple[Pending, ConveyorError]]


class LevelQueue:
    __slots__ = ("delayed", "level", "permanent", "policy", "ready")

    def __init__(self, policy: QueuePolicy, level: int, permanent: bool) -> None:
        self.policy = policy
        self.level = level
        self.permanent = permanent  # the default level, or one with a policy of its own: kept when empty
        self.ready: deque[Pending] = deque()
        self.delayed: deque[Pending] = deque()  # timed out under DELAY: served after `ready`

    def __len__(self) -> int:
        return len(self.ready) + len(self.delayed)


class PriorityQueues:
    def __init__(self, policy: SchedulingPolicy, cap: int) -> None:
        self.policy = policy
        kept = {policy.default_level, *policy.policies}
        # The levels that hold requests (and the kept ones), highest first; ``_at``: the same by number.
        self.levels = [LevelQueue(policy.policy_of(n), n, True) for n in sorted(kept)]
        self._at = {q.level: q for q in self.levels}
        self.cap = cap  # server-wide safety cap on the total; 0 = none
        self.size = 0  # queued requests (``DynamicBatcher.__len__`` reads it: one call, not two, per len)
        self._timed = 0  # queued requests that can expire: 0 skips every scan
        self._next_expiry = 0  # no queued request expires before this (a lower bound)

    def __len__(self) -> int:
        return self.size

    def push(self, item: Pending) -> None:
        """Queue ``item`` at the level its ``priority`` parameter picks; raises
        UNAVAILABLE when that level, or the model, is full."""
        params = item.request.parameters
        number = self.policy.level_of(params.get("priority")) if params else self.policy.default_level
        level = self._at.get(number)
        new = level is None
        if level is None:
            level = LevelQueue(self.policy.policy_of(number), number, False)
        limit = level.policy.max_queue_size
        if limit and len(level) >= limit:
            raise unavailable(request_prefix(item.request.request_id) + "Exceeds maximum queue size")
        if self.cap and self.size >= self.cap:
            raise unavailable(
                f"Exceeds maximum queue size: {self.size} requests already wait for this model "
                "(the server's --max-queue-size)"
            )
        if new:  # a level's first request: its queue, in its place
            insort(self.levels, level, key=_number)
            self._at[number] = level
        item.level = number
        timeout = level.policy.timeout_ns(params.get("timeout")) if params else level.policy.default_timeout_ns
        expires = item.request.deadline_ns
        if timeout:
            item.timeout_ns = timeout = item.arrival_ns + timeout
            if not expires or timeout < expires:
                expires = timeout
        level.ready.append(item)
        self.size += 1
        if expires:
            if not self._timed or expires < self._next_expiry:
                self._next_expiry = expires
            self._timed += 1

    def _drop_if_empty(self, level: LevelQueue) -> None:
        """A level made for its requests goes when they have: clients cannot grow the router with priorities."""
        if not level.permanent and not level.ready and not level.delayed:
            self.levels.remove(level)
            del self._at[level.level]

    def in_order(self) -> Iterator[Pending]:
        """Every queued request, in service order (no copy)."""
        levels = self.levels
        if len(levels) == 1 and not levels[0].delayed:
            return iter(levels[0].ready)
        return chain.from_iterable(chain(q.ready, q.delayed) for q in levels)

    def pop(self) -> Pending:
        """The first request in service order."""
        for level in self.levels:
            queue = level.ready or level.delayed
            if queue:
                item = queue.popleft()
                self._left(item)
                if not level.permanent:
                    self._drop_if_empty(level)
                return item
        raise IndexError("pop from empty PriorityQueues")

    def take(self, count: int) -> list[Pending]:
        """The first ``count`` requests in service order."""
        first = self.levels[0]
        ready = first.ready
        if len(ready) >= count and not self._timed:  # the common case: one plain FIFO
            self.size -= count
            taken = [ready.popleft() for _ in range(count)]
            if not first.permanent:
                self._drop_if_empty(first)
            return taken
        return [self.pop() for _ in range(count)]

    def remove(self, ingress: bytes, request_id: int) -> Pending | None:
        for level in self.levels:
            for queue in (level.ready, level.delayed):
                for item in queue:
                    if item.request.id == request_id and item.ingress == ingress:
                        queue.remove(item)
                        self._left(item)
                        self._drop_if_empty(level)
                        return item
        return None

    def _left(self, item: Pending) -> None:
        self.size -= 1
        if self._timed and (item.request.deadline_ns or item.timeout_ns):
            self._timed -= 1

    @property
    def next_expiry_ns(self) -> int:
        """When ``take_expired`` may next have something to do; 0 = never."""
        return self._next_expiry if self._timed else 0

    def take_expired(self, now_ns: int) -> Expired:
        """Remove the requests that must not run any more, with their answer:
        the client's deadline passed, or the queue timeout under REJECT. Under
        DELAY a timed-out request moves behind its level's other requests."""
        if not self._timed or now_ns < self._next_expiry:
            return []
        gone: Expired = []
        next_expiry = 0
        for level in self.levels:
            keep: deque[Pending] = deque()
            for item in level.ready:
                deadline, timeout = item.request.deadline_ns, item.timeout_ns
                if deadline and deadline <= now_ns:
                    gone.append((item, DEADLINE_PASSED))
                    continue
                if timeout and timeout <= now_ns:
                    if not level.policy.delay_on_timeout:
                        gone.append((item, QUEUE_TIMEOUT))
                        continue
                    item.timeout_ns = 0
                    level.delayed.append(item)  # its deadline, if any, is looked at below
                    if not deadline:
                        self._timed -= 1  # nothing can expire it any more
                    continue
                keep.append(item)
                expires = item.expires_ns()
                if expires and (not next_expiry or expires < next_expiry):
                    next_expiry = expires
            level.ready = keep
            if not level.delayed:
                continue
            still: deque[Pending] = deque()
            for item in level.delayed:
                deadline = item.request.deadline_ns
                if deadline and deadline <= now_ns:
                    gone.append((item, DEADLINE_PASSED))
                    continue
                still.append(item)
                if deadline and (not next_expiry or deadline < next_expiry):
                    next_expiry = deadline
            level.delayed = still
        for level in [q for q in self.levels if not q.permanent and not q.ready and not q.delayed]:
            self._drop_if_empty(level)
        self.size -= len(gone)
        self._timed -= len(gone)
        self._next_expiry = next_expiry
        return gone


def _number(level: LevelQueue) -> int:
    return level.level
