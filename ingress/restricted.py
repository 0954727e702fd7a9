"""Triton's restricted APIs: groups of API categories that need a header with a set value.

``--http-restricted-api=<api>,<api>...:<key>=<value>`` and
``--grpc-restricted-protocol=<protocol>,...:<key>=<value>``, repeatable, each
category in one group at most. Over HTTP the header is ``<key>``; over gRPC the
metadata key is ``triton-grpc-protocol-<key>``. A request to a restricted
category without it is refused as Triton refuses it: HTTP 403 ``This API is
restricted, expecting header '<key>'``, gRPC UNAVAILABLE ``This protocol is
restricted, expecting header 'triton-grpc-protocol-<key>'``.
"""

from __future__ import annotations

from dataclasses import dataclass

# Triton's category names (server src/restricted_features.h).
CATEGORIES = (
    "health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
    "statistics", "trace", "logging",
)
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


@dataclass(frozen=True, slots=True)
class Restriction:
    header: str
    value: str


@dataclass(frozen=True, slots=True)
class RestrictedGroup:
    """One flag's value: these categories need ``key: value``."""

    categories: tuple[str, ...]
    key: str
    value: str


def parse_group(text: str) -> RestrictedGroup:
    """One ``<api>,<api>...:<key>=<value>`` flag value; ValueError when malformed."""
    apis, colon, pair = text.partition(":")
    key, equals, value = pair.partition("=")
    if not colon or not equals or not key or not apis:
        raise ValueError(f"expected <api>,<api>...:<key>=<value>, got '{text}'")
    categories = tuple(a.strip() for a in apis.split(","))
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise ValueError(f"unknown API '{unknown[0]}' in '{text}': expected one of {', '.join(CATEGORIES)}")
    return RestrictedGroup(categories, key, value)


def restrictions(groups: list[RestrictedGroup], header_prefix: str = "") -> dict[str, Restriction]:
    """Category -> what it needs; ValueError when a category is in two groups (as Triton)."""
    rules: dict[str, Restriction] = {}
    for group in groups:
        for category in group.categories:
            if category in rules:
                raise ValueError(f"API '{category}' is in more than one restricted group")
            # gRPC metadata keys are lower-case on the wire.
            header = (header_prefix + group.key).lower() if header_prefix else group.key
            rules[category] = Restriction(header, group.value)
    return rules


def http_refusal(rule: Restriction) -> str:
    return f"This API is restricted, expecting header '{rule.header}'"


def grpc_refusal(rule: Restriction) -> str:
    return f"This protocol is restricted, expecting header '{rule.header}'"
