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


def tried(name: str) -> None:
    CASES[name] += 1


def bounded(max_examples: int) -> settings:
    """Settings for one fuzz test: ``max_examples`` cases, no deadline."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                               HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
