"""The signatures BLS requests are checked against before they are sent.

A worker checks its models' BLS requests as the ingress checks a client's
(``proto/request_checks.py`` against the router's ``signature``), so a wrong
input name, datatype or shape, an unknown output or an unknown model fails only
that ``exec()`` call, with the ingress's message, and never reaches (or fails)
the callee's batch. Signatures are fetched once per model version and dropped
when the router's repository generation changes, as the ingress's cache is.
"""

from __future__ import annotations

from conveyor.proto.signature import ModelSignature
from conveyor.workers.bls_link import BlsLink


class BlsSignatures:
    """Any thread but the worker's main thread (fetching waits for the router)."""

    def __init__(self, link: BlsLink) -> None:
        self._link = link
        self._cache: dict[tuple[str, str], ModelSignature] = {}
        self._generation = 0

    def get(self, model: str, version: str) -> ModelSignature:
        """Raises ``ConveyorError`` (NOT_FOUND, UNAVAILABLE) as the router resolves the model."""
        if self._link.generation != self._generation:
            self._cache.clear()
            self._generation = self._link.generation
        sig = self._cache.get((model, version))
        return sig if sig is not None else self._fetch(model, version)

    def refresh(self, model: str, version: str) -> ModelSignature | None:
        """A fresh signature, or None when the repository has not changed since
        (then the cached one was right, and so was its refusal)."""
        old = self._cache.get((model, version))
        generation = self._generation
        sig = self._fetch(model, version)
        return None if old is not None and self._generation == generation else sig

    def _fetch(self, model: str, version: str) -> ModelSignature:
        reply = self._link.signature(model, version)
        generation = reply.generation
        if generation != self._generation:
            self._cache.clear()
            self._generation = generation
        self._link.generation = generation  # until a response says otherwise
        sig = ModelSignature.from_wire(reply.signature)
        self._cache[(model, version)] = sig
        return sig
