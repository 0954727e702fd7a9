"""A ``DynamicBatcher`` whose queue delay comes from an ``AdaptiveController``
(see ``router/adaptive.py``) instead of the config."""

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
        self.adaptive = AdaptiveController(target_ns, self.max_batch_size)
        self._applied: Plan | None = None

    def next_batch(self, now_ns: int) -> list[Pending] | int | None:
        controller = self.adaptive
        assert controller is not None
        plan = controller.plan(now_ns)
        if plan is not self._applied:
            self._applied = plan
            self.preferred = frozenset(range(plan.batch_size, plan.max_batch_size + 1))
            self.max_preferred = self.max_batch_size = plan.max_batch_size
            self.max_delay_ns = plan.delay_ns
        return super().next_batch(now_ns)
