"""Triton's scheduler test hooks, read from the router's environment when a model loads, as Triton's
schedulers read them when their threads start: Triton's own QA (``qa/L0_batcher``,
``qa/L0_sequence_batcher``, ...) sets them so that it knows which batches form.

- ``TRITONSERVER_DELAY_SCHEDULER=N``: a model's scheduler sends nothing until N requests are queued
  (the dynamic batcher: in its queue; a sequence batcher: in its instances' slots, the backlog not
  counted), then schedules as always from then on.
- ``TRITONSERVER_BACKLOG_DELAY_SCHEDULER=M``: with the first, a sequence batcher also waits for M
  requests in its backlog (sequences that have no slot yet).

Unset (every real deployment) they cost a batcher one attribute test per batch.
"""

from __future__ import annotations

import logging
import os
import re

log = logging.getLogger(__name__)

DELAY_ENV = "TRITONSERVER_DELAY_SCHEDULER"
BACKLOG_DELAY_ENV = "TRITONSERVER_BACKLOG_DELAY_SCHEDULER"
_LEADING_NUMBER = re.compile(r"\s*([+-]?\d+)")  # what C's atoi reads, as Triton parses them


def _count(name: str) -> int:
    found = _LEADING_NUMBER.match(os.environ.get(name, ""))
    return max(int(found[1]), 0) if found else 0


def held_until(model: str) -> int:
    """The requests a scheduler of ``model`` waits for before its first batch (0: none)."""
    count = _count(DELAY_ENV)
    if count:
        log.info("Delaying scheduler of '%s' until %d queued requests (%s)", model, count, DELAY_ENV)
    return count


def backlog_held_until(model: str) -> int:
    """The backlog a sequence batcher of ``model`` also waits for, while ``held_until`` holds it (0: none)."""
    count = _count(BACKLOG_DELAY_ENV)
    if count:
        log.info("Delaying scheduler of '%s' until %d backlogged requests (%s)", model, count, BACKLOG_DELAY_ENV)
    return count
