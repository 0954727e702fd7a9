"""Triton's restricted APIs: groups of API categories that need a header with a set value.

``--http-restricted-api=<api>,<api>...:<key>=<value>`` and
``--grpc-restricted-protocol=<protocol>,...:<key>=<value>``, repeatable, each
category in one group at most. Over HTTP the header is ``<key>``; over gRPC the
metadata key is ``triton-grpc-protocol-<key>``. A request to a restricted
category without it is refused as Triton refuses it: HTTP 403 ``This API is
restricted, expecting header '<key>'``, gRPC UNAVAILABLE ``This protocol is
restricted, expecting header 'triton-grpc-protocol-<key>'``.

``--openai-restricted-api <api>,<api>... <key> <value>`` is Triton's OpenAI frontend's flag (its
categories are ``OPENAI_CATEGORIES``); refused there with 401 and OpenAI's error body.

A category restricted on one ingress is restricted on every ingress that serves it: the HTTP-family
ports (KServe HTTP, SageMaker, Vertex AI, metrics) and the OpenAI port each take the union of both
flags (``port_rules``), their own flag's group winning where both name a category. gRPC keeps its
own flag only, as Triton (its metadata key is spelled differently, and Triton's QA restricts one
protocol while probing the other).
"""

from __future__ import annotations

from dataclasses import dataclass

# Triton's category names (server src/restricted_features.h).
CATEGORIES = (
    "health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
    "statistics", "trace", "logging",
)
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
# Triton's OpenAI frontend's categories (python/openai/.../middleware/api_restriction.py ENDPOINT_MAPPING).
OPENAI_CATEGORIES = ("inference", "model-repository", "metrics", "health")


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


def _split(text: str) -> RestrictedGroup:
    apis, colon, pair = text.partition(":")
    key, equals, value = pair.partition("=")
    if not colon or not equals or not key or not apis or not value:
        raise ValueError(f"expected <api>,<api>...:<key>=<value>, got '{text}'")
    return RestrictedGroup(tuple(a.strip() for a in apis.split(",")), key, value)


def parse_group(text: str) -> RestrictedGroup:
    """One ``<api>,<api>...:<key>=<value>`` flag value; ValueError when malformed."""
    group = _split(text)
    unknown = [c for c in group.categories if c not in CATEGORIES]
    if unknown:
        raise ValueError(f"unknown API '{unknown[0]}' in '{text}': expected one of {', '.join(CATEGORIES)}")
    return group


def parse_openai_group(words: list[str]) -> RestrictedGroup:
    """One ``--openai-restricted-api`` value: Triton's three words ``<api>,<api>... <key> <value>``, or
    the one word ``<api>,...:<key>=<value>`` of the other restricted flags; ValueError when malformed."""
    if len(words) == 3:
        apis, key, value = (w.strip() for w in words)
        if not apis or not key or not value:
            raise ValueError(f"expected <api>,<api>... <key> <value>, got '{' '.join(words)}'")
        group = RestrictedGroup(tuple(a.strip() for a in apis.split(",")), key, value)
    elif len(words) == 1:
        group = _split(words[0])
    else:
        raise ValueError(f"expected <api>,<api>... <key> <value>, got '{' '.join(words)}'")
    for category in group.categories:
        if category not in OPENAI_CATEGORIES:  # Triton's words
            raise ValueError(f"Unknown API '{category}'. Available APIs: {list(OPENAI_CATEGORIES)}")
    return group


def openai_restrictions(groups: list[RestrictedGroup]) -> dict[str, Restriction]:
    """Category -> what it needs; ValueError, in Triton's OpenAI frontend's words, for a category in two groups."""
    rules: dict[str, Restriction] = {}
    for group in groups:
        for category in group.categories:
            if category in rules:
                raise ValueError(f"restricted api '{category}' can not be specified in multiple config groups")
            rules[category] = Restriction(group.key, group.value)
    return rules


def port_rules(own: dict[str, Restriction], other: dict[str, Restriction]) -> dict[str, Restriction]:
    """What an HTTP-family or OpenAI port enforces: its own flag's rules, and the other flag's for the
    categories its own leaves open (a category restricted on one ingress is restricted on every one)."""
    return {**other, **own}


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


def openai_refusal(rule: Restriction) -> str:
    """Triton's OpenAI frontend's words (sent with 401, ``authentication_error``, ``invalid_auth``)."""
    return f"This API is restricted, expecting header '{rule.header}' with valid value"


def grpc_refusal(rule: Restriction) -> str:
    return f"This protocol is restricted, expecting header '{rule.header}'"
