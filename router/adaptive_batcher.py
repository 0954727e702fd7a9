"""A ``DynamicBatcher`` whose preferred size and queue delay come from an
``AdaptiveController`` (see ``router/adaptive.py``) instead of the config."""

from __future__ import annotations

from conveyor.router.adaptive import AdaptiveController, Plan
from conveyor.router.batcher import DynamicBatcher
from conveyor.router.pending import Pending
from conveyor.router.queue_policy import DEFAULT_QUEUE_CAP, SchedulingPolicy


class AdaptiveBatcher(DynamicBatcher):
    def __init__(
        self, max_batch_size: int, target_ns: int, policy: SchedulingPolicy | None = None,
        queue_cap: int = DEFAULT_QUEUE_CAP,
    ) -> None:
        super().__init__(max_batch_size, [], 0, True, policy, queue_cap)
        self.adaptive = controller = AdaptiveController(target_ns, self.max_batch_size)
        self._applied: Plan | None = None
        queue_push = self.queues.push

        def push(item: Pending) -> None:
            queue_push(item)
            controller.arrived(item.arrival_ns, item.rows)

        self.push = push

    def next_batch(self, now_ns: int) -> list[Pending] | int | None:
        controller = self.adaptive
        assert controller is not None
        plan = controller.plan(now_ns)
        if plan is not self._applied:
            # Any size from B to M leaves at once (the largest that can be formed); below B it waits up to D.
            self._applied = plan
            self.preferred = frozenset(range(plan.batch_size, plan.max_batch_size + 1))
            self.max_preferred = self.max_batch_size = plan.max_batch_size
            self.max_delay_ns = plan.delay_ns
        batch = super().next_batch(now_ns)
        if isinstance(batch, list):
            rows = sum(p.rows for p in batch)
            controller.batch_left(rows, len(self.queues))
        return batch
