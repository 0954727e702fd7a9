"""Triton's queue policies and priority levels (``dynamic_batching`` in config.pbtxt),
read once per model version, plus the checks Triton applies to them at load.

* ``priority_levels`` N > 0 gives levels 1 (highest) .. N; a request's
  ``priority`` parameter picks one. 0, or a value above N, means
  ``default_priority_level`` (Triton does the same: no error). N may be as
  large as 2^64 - 1 (Triton's qa/L0_model_queue uses that): the levels are
  numbers, and a level's queue exists only while it holds requests (or has
  a policy of its own), as Triton's map of queues.
* Each level has a ``QueuePolicy``: ``priority_queue_policy[level]`` or else
  ``default_queue_policy``.
* A request's ``timeout`` parameter (microseconds) counts only when the policy
  allows overrides, and only to shorten ``default_timeout_microseconds``: with
  no default timeout it has no effect. That is Triton's rule too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from conveyor.proto import model_config_pb2 as mc

# Requests one model version may hold queued when its config sets no smaller
# max_queue_size (router option --max-queue-size; 0 = no cap): overload then
# answers "queue full" instead of growing the router without bound.
DEFAULT_QUEUE_CAP = 10_000


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """One priority level's ``ModelQueuePolicy``."""

    delay_on_timeout: bool = False  # timeout_action DELAY; REJECT otherwise
    default_timeout_ns: int = 0  # 0: requests never time out in the queue
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0: unbounded (but for the server-wide cap)

    @classmethod
    def from_config(cls, policy: mc.ModelQueuePolicy) -> QueuePolicy:
        return cls(
            delay_on_timeout=policy.timeout_action == mc.ModelQueuePolicy.DELAY,
            default_timeout_ns=policy.default_timeout_microseconds * 1000,
            allow_timeout_override=policy.allow_timeout_override,
            max_queue_size=policy.max_queue_size,
        )

    def timeout_ns(self, requested_us: object) -> int:
        """How long (ns) a request may wait in the queue; 0 for ever."""
        timeout = self.default_timeout_ns
        if self.allow_timeout_override and type(requested_us) is int and 0 < requested_us * 1000 < timeout:
            timeout = requested_us * 1000
        return timeout


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    """The priority levels of one model version, by number: 1 is the highest; 0 is the one level of a model
    without ``priority_levels``."""

    default: QueuePolicy = QueuePolicy()  # default_queue_policy: every level without a policy of its own
    count: int = 0  # priority_levels
    default_level: int = 0  # default_priority_level (0 without levels)
    policies: Mapping[int, QueuePolicy] = field(default_factory=dict)  # priority_queue_policy, by level

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> SchedulingPolicy:
        db = config.dynamic_batching
        default = QueuePolicy.from_config(db.default_queue_policy)
        if db.priority_levels == 0:
            return cls(default)
        policies = {level: QueuePolicy.from_config(p) for level, p in db.priority_queue_policy.items()
                    if 0 < level <= db.priority_levels}
        return cls(default, db.priority_levels, db.default_priority_level, policies)

    def level_of(self, priority: object) -> int:
        """The level a request with this ``priority`` parameter waits at."""
        if type(priority) is int and 0 < priority <= self.count:
            return priority
        return self.default_level

    def policy_of(self, level: int) -> QueuePolicy:
        return self.policies.get(level, self.default)
