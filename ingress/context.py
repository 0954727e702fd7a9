"""Everything one ingress process holds: its arena, the router link, the data plane."""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.ingress.dataplane import DataPlane
from conveyor.ingress.limits import IngressLimits
from conveyor.ingress.router_link import RouterLink
from conveyor.shm.arena import Arena
from conveyor.shm.naming import segment_name
from conveyor.shm.regions import RegionCache

DEFAULT_ARENA_BYTES = 256 << 20  # tmpfs pages are only used once touched


@dataclass
class IngressContext:
    link: RouterLink
    dataplane: DataPlane
    arena: Arena

    @classmethod
    async def create(
        cls, router: str, group: str, arena_bytes: int = DEFAULT_ARENA_BYTES, limits: IngressLimits | None = None
    ) -> IngressContext:
        """Connect to the router at ``router`` (a ZeroMQ endpoint)."""
        arena = Arena(segment_name(group, "ingress"), arena_bytes)
        link = RouterLink(router)
        dataplane = DataPlane(link, arena, RegionCache(), limits)
        await link.start()
        return cls(link, dataplane, arena)

    async def close(self) -> None:
        await self.link.close()
        self.arena.close()
