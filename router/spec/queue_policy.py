"""The checks Triton applies at load to a config's ``dynamic_batching`` (its priority levels and queue
policies: ``router/scheduling/queue_policy.py`` reads them)."""

from __future__ import annotations

from conveyor.proto import model_config_pb2 as mc


def scheduling_problem(config: mc.ModelConfig) -> str:
    """The first ``dynamic_batching`` setting Triton would refuse to load, in its words (" for <model>"), or ''."""
    if not config.HasField("dynamic_batching"):
        return ""
    db, name = config.dynamic_batching, config.name
    for size in db.preferred_batch_size:
        if size <= 0:
            return f"dynamic batching preferred size must be positive for {name}"
        if size > config.max_batch_size:
            return f"dynamic batching preferred size must be <= max batch size for {name}"
    levels = db.priority_levels
    if levels:
        if not 1 <= db.default_priority_level <= levels:
            return f"default priority level must be in range [1, {levels}] for {name}"
        if any(not 1 <= level <= levels for level in db.priority_queue_policy):
            return f"priority queue policy must have priority level in range [1, {levels}] for {name}"
    if db.preserve_ordering:
        if levels > 1:
            return f"Only one priority level is allowed when 'preserve_ordering' is true for {name}"
        policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
        if any(p.default_timeout_microseconds and p.timeout_action == mc.ModelQueuePolicy.DELAY for p in policies):
            return f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for {name}"
    return ""
