"""The model a single-model cloud endpoint serves when none is named."""

from __future__ import annotations

from conveyor.proto.control import RouterClient


class DefaultModel:
    """``name`` when given; else the repository's only model, looked up on first use
    and kept (the router may not have scanned its repositories when this process starts).
    ``missing`` is what an empty or ambiguous repository resolves to: requests then
    fail as for an unknown model."""

    def __init__(self, link: RouterClient, name: str, missing: str, *, ready_only: bool = False) -> None:
        self._link = link
        self._name = name
        self._missing = missing
        self._ready_only = ready_only

    async def get(self) -> str:
        if self._name:
            return self._name
        rows = await self._link.repository_index(self._ready_only)
        names = {row["name"] for row in rows}
        if len(names) != 1:
            return self._missing
        self._name = names.pop()
        return self._name
