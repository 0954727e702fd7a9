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


def bounded(max_examples: int) -> settings:
    """Settings for one fuzz test: ``max_examples`` cases, no deadline."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                               HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
