"""The dynamic batcher: one queue per model version, turned into batches when an
instance is free.

Policy (first cut of Triton's ``dynamic_batching``):

* Requests are taken in arrival order; a batch holds consecutive requests whose
  non-batch shapes match the head's, up to ``max_batch_size`` rows.
* A batch leaves at once when it reaches the largest preferred size (or
  ``max_batch_size``), when the next request can't join it, or when its oldest
  request has waited ``max_queue_delay``; otherwise the batcher asks to be
  woken at that deadline. With no delay configured, whatever is queued when an
  instance frees up goes together — batches grow with load by themselves.
* Without dynamic batching every request is its own batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from conveyor.proto import messages as m


@dataclass(slots=True)
class Pending:
    """A queued request and where its answer goes."""

    ingress: bytes
    request: m.InferRequest
    arrival_ns: int
    rows: int
    shape_key: tuple[object, ...]


def shape_key(request: m.InferRequest, batched: bool) -> tuple[object, ...]:
    """Requests batch together only when every non-batch dimension matches."""
    if not batched:
        return ()
    return tuple((t.name, t.datatype, *t.shape[1:]) for t in request.inputs)


class DynamicBatcher:
    def __init__(
        self, max_batch_size: int, preferred: list[int], max_delay_ns: int, enabled: bool
    ) -> None:
        self.max_batch_size = max(max_batch_size, 1)
        self.enabled = enabled and max_batch_size > 0
        sizes = [p for p in preferred if 0 < p <= self.max_batch_size]
        self.target = max(sizes) if sizes else self.max_batch_size
        self.max_delay_ns = max_delay_ns
        self.queue: deque[Pending] = deque()
        self._with_deadline = 0  # queued requests that carry a deadline: 0 skips the scan

    def __len__(self) -> int:
        return len(self.queue)

    def push(self, item: Pending) -> None:
        self.queue.append(item)
        if item.request.deadline_ns:
            self._with_deadline += 1

    def _left(self, item: Pending) -> None:
        if item.request.deadline_ns:
            self._with_deadline -= 1

    def remove(self, ingress: bytes, request_id: int) -> Pending | None:
        for item in self.queue:
            if item.request.id == request_id and item.ingress == ingress:
                self.queue.remove(item)
                self._left(item)
                return item
        return None

    def pop(self) -> Pending:
        item = self.queue.popleft()
        self._left(item)
        return item

    def take_expired(self, now_ns: int) -> list[Pending]:
        """Requests whose deadline has passed while queued (never executed)."""
        if not self._with_deadline:
            return []
        if not any(p.request.deadline_ns and p.request.deadline_ns <= now_ns for p in self.queue):
            return []
        keep: deque[Pending] = deque()
        gone: list[Pending] = []
        for p in self.queue:
            (gone if p.request.deadline_ns and p.request.deadline_ns <= now_ns else keep).append(p)
        self.queue = keep
        self._with_deadline -= len(gone)
        return gone

    def next_batch(self, now_ns: int) -> list[Pending] | int | None:
        """A batch to run now, or the time (ns) to ask again, or None if empty."""
        queue = self.queue
        if not queue:
            return None
        if not self.enabled:
            return [self.pop()]
        head = queue[0]
        rows = 0
        count = 0
        blocked = False
        for item in queue:
            if item.shape_key != head.shape_key or rows + item.rows > self.max_batch_size:
                blocked = True
                break
            rows += item.rows
            count += 1
            if rows >= self.target:
                break
        due = head.arrival_ns + self.max_delay_ns
        if rows < self.target and not blocked and now_ns < due:
            return due
        return [self.pop() for _ in range(count)]
