"""Everything one ingress process holds: its arena, the router link, the data plane."""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.ingress.dataplane import DataPlane
from conveyor.ingress.drain import IngressDrain
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
    drain: IngressDrain

    @classmethod
    async def create(
        cls, router: str, group: str, arena_bytes: int = DEFAULT_ARENA_BYTES, *,
        drain_grace_s: float = 0.0, exit_timeout_s: float = 30.0, limits: IngressLimits | None = None,
    ) -> IngressContext:
        """Connect to the router at ``router`` (a ZeroMQ endpoint)."""
        arena = Arena(segment_name(group, "ingress"), arena_bytes)
        link = RouterLink(router)
        drain = IngressDrain(drain_grace_s, exit_timeout_s)
        dataplane = DataPlane(link, arena, RegionCache(), drain, limits)
        await link.start()
        return cls(link, dataplane, arena, drain)

    async def close(self) -> None:
        await self.link.close()
        self.arena.close()
