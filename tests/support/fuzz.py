"""Shared settings of the property-based (fuzz) tests and their case counter.

Every fuzz test calls ``tried(name)`` once per generated case; the terminal
summary (``conftest.pytest_terminal_summary``) prints the counts, so each run
says how many cases it tried. Examples are bounded and deadlines off: the
machines running the suite are shared and loaded, and a slow case is not a bug.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings

CASES: Counter[str] = Counter()

# The client mistakes Triton answers with 500 / INTERNAL (Status.CLIENT_MISTAKE; 400 with
# --client-mistakes-as-400): an HTTP fuzz target accepts a 500 with one of these words, and no other.
CLIENT_MISTAKES_500 = ("Unable to parse 'shape': attempt to access JSON non-unsigned-integer",
                       "Unable to parse 'data': Shape does not match true shape of 'data' field")


def tried(name: str) -> None:
    CASES[name] += 1


# The quick level (``pytest -m unit``, set by tests/conftest.py) tries this share of each target's cases:
# enough to catch a target that broke, while the whole suite keeps the full count.
QUICK = False
QUICK_SHARE = 0.1


def bounded(max_examples: int) -> settings:
    """Settings for one fuzz test: ``max_examples`` cases (a tenth at the quick level), no deadline."""
    return settings(
        max_examples=max(10, int(max_examples * QUICK_SHARE)) if QUICK else max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                               HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
