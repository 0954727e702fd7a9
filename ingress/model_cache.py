"""What the ingress knows of each model: its input/output signature, fetched from
the router once and kept until the router's repository generation changes."""

from __future__ import annotations

from conveyor.proto.control import RouterClient
from conveyor.proto.signature import ModelSignature


class ModelSignatureCache:
    def __init__(self, link: RouterClient) -> None:
        self._link = link
        self._cache: dict[tuple[str, str], ModelSignature] = {}
        self._generation = -1

    async def get(self, model: str, version: str) -> ModelSignature:
        sig = self._cache.get((model, version))
        if sig is None:
            # Raises NOT_FOUND / UNAVAILABLE for unknown or unready models.
            reply = await self._link.signature(model, version)
            self.observe_generation(reply.generation)
            sig = ModelSignature.from_wire(reply.signature)
            self._cache[(model, version)] = sig
        return sig

    def cached(self, model: str, version: str) -> ModelSignature | None:
        """The signature kept for ``model``/``version``, if any (``get`` without asking the router)."""
        return self._cache.get((model, version))

    async def refresh(self, model: str, version: str) -> ModelSignature:
        """Ask the router again; the cached signature itself if the repository has not
        changed since (so a caller can tell a stale cache from a bad request)."""
        old = self._cache.get((model, version))
        reply = await self._link.signature(model, version)
        generation = reply.generation
        if old is not None and generation == self._generation:
            return old
        self.observe_generation(generation)
        sig = ModelSignature.from_wire(reply.signature)
        self._cache[(model, version)] = sig
        return sig

    @property
    def generation(self) -> int:
        """The router's repository generation the cache holds (-1: none seen yet)."""
        return self._generation

    def forget(self, model: str) -> None:
        """Drop what is kept of ``model``: this ingress had it loaded or unloaded, and its next request must
        not be answered from before (the router's announcement of the change may come after its answer)."""
        for key in [key for key in self._cache if key[0] == model]:
            del self._cache[key]

    def observe_generation(self, generation: int) -> None:
        """Drop everything when the router's repository has changed."""
        if generation != self._generation:
            self._cache.clear()
            self._generation = generation
