"""Arenas, the allocator and the orphan sweep, on real POSIX shared memory."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conveyor.proto.errors import ConveyorError
from conveyor.shm.allocator import BlockAllocator
from conveyor.shm.arena import HELD, RECLAIM_BLOCKS, RELEASED, Arena
from conveyor.shm.naming import group_segments, segment_name, shm_preflight, sweep_orphans
from conveyor.shm.regions import RegionCache

LEVEL = "e2e"


def test_allocator_reuses_and_coalesces() -> None:
    a = BlockAllocator(1024)
    x, y, z = a.alloc(100), a.alloc(100), a.alloc(100)
    assert (x, y, z) == (0, 128, 256)
    a.free(y)  # type: ignore[arg-type]
    a.free(x)  # type: ignore[arg-type]
    assert a.alloc(200) == 0  # x and y merged
    a.free(0)
    a.free(z)  # type: ignore[arg-type]
    assert a.alloc(1024) == 0  # everything merged back


def test_arena_full_is_a_clear_error() -> None:
    arena = Arena(segment_name(f"u{os.getpid()}", "test"), 4096)
    try:
        arena.alloc(4000)
        with pytest.raises(ConveyorError, match="arena"):
            arena.alloc(4000)
    finally:
        arena.close()


def test_released_blocks_come_back_once_every_consumer_flags() -> None:
    arena = Arena(segment_name(f"u{os.getpid()}", "test"), 1 << 16)
    regions = RegionCache()
    try:
        payload, flags = arena.alloc_released(1000, 2)
        regions.view(arena.name, payload, 4)[:] = 9
        assert arena.array[payload] == 9
        regions.view(arena.name, flags, 1)[0] = 1
        assert arena.reclaim() == 0
        regions.view(arena.name, flags + 1, 1)[0] = 1
        assert arena.reclaim() == 1 and arena.outstanding == 0
    finally:
        arena.close()


def test_released_blocks_are_reclaimed_in_rounds_and_always_before_the_arena_is_full() -> None:
    """The flags are read once the pending blocks doubled (or enough bytes went out), not before
    every allocation: what waits unreclaimed stays bounded, and a full arena still looks first."""
    arena = Arena(segment_name(f"r{os.getpid()}", "test"), 1 << 20)
    try:
        live = [arena.alloc_released(64, 1)[1] for _ in range(40)]  # their consumers still read
        for _ in range(1000):  # released at once, as an ingress does after each response
            _, flags = arena.alloc_released(64, 1)
            arena.array[flags] = RELEASED
            assert arena.outstanding <= 2 * len(live) + 1
        for flags in live:
            arena.array[flags] = RELEASED
        for _ in range(200):
            _, flags = arena.alloc_released(64, 1)
            arena.array[flags] = RELEASED
        assert arena.outstanding <= RECLAIM_BLOCKS
        big = (1 << 20) // 3
        for _ in range(20):  # three such blocks never fit: each allocation needs released ones back
            _, flags = arena.alloc_released(big, 1)
            arena.array[flags] = RELEASED
    finally:
        arena.close()


def test_abandoned_blocks_come_back_unless_the_router_holds_them(monkeypatch: pytest.MonkeyPatch) -> None:
    arena = Arena(segment_name(f"a{os.getpid()}", "test"), 1 << 16)
    try:
        arena.alloc_released(100, 1)  # its consumer died
        _, held = arena.alloc_released(100, 1)  # the router keeps it (ensemble, cache)
        _, two = arena.alloc_released(100, 2)  # one of two consumers released, the other died
        _, mixed = arena.alloc_released(100, 2)  # one released, one held
        arena.array[held] = HELD
        arena.array[two] = RELEASED
        arena.array[mixed] = RELEASED
        arena.array[mixed + 1] = HELD
        assert arena.reclaim() == 0  # nobody is late yet
        monkeypatch.setattr(time, "monotonic", lambda: 10**9)  # long after ABANDONED_AFTER_S
        assert arena.reclaim() == 2 and arena.outstanding == 2  # one, two
        arena.array[held] = RELEASED
        arena.array[mixed + 1] = RELEASED
        assert arena.reclaim() == 2 and arena.outstanding == 0
    finally:
        arena.close()


def test_view_outside_region_is_rejected() -> None:
    arena = Arena(segment_name(f"u{os.getpid()}", "test"), 4096)
    try:
        with pytest.raises(ConveyorError, match="outside"):
            RegionCache().view(arena.name, 4000, 200)
        for offset, nbytes in ((4000, 200), (-1, 4), (0, -1)):
            with pytest.raises(ConveyorError, match="outside"):
                RegionCache().span(arena.name, offset, nbytes)
    finally:
        arena.close()


def test_span_is_the_views_bytes_and_forget_drops_it() -> None:
    arena = Arena(segment_name(f"u{os.getpid()}", "test"), 4096)
    regions = RegionCache()
    try:
        arena.array[100:104] = [1, 2, 3, 4]
        span = regions.span(arena.name, 100, 4)
        assert span.nbytes == 4 and bytes(span) == bytes(regions.view(arena.name, 100, 4)) == b"\1\2\3\4"
        arena.array[100] = 9
        assert span[0] == 9  # a view of the mapping, not a copy
        assert regions.span(arena.name, 4096, 0).nbytes == 0  # an empty output at the very end
        regions.forget(arena.name)
        assert arena.name not in regions.mapped
    finally:
        arena.close()


def test_sweep_frees_segments_of_dead_owners() -> None:
    group = f"sweep{os.getpid()}"
    code = (
        "from conveyor.shm.arena import Arena; from conveyor.shm.naming import segment_name; "
        f"Arena(segment_name('{group}', 'worker'), 4096)"  # never closed: the process 'crashes'
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert len(group_segments(group)) == 1
    assert len(sweep_orphans(group)) == 1
    assert group_segments(group) == []


def test_the_segments_of_a_zombie_are_swept() -> None:
    # A killed group's actors stay zombies where init does not reap orphans (a container's init may
    # not): they hold no memory, and the next start frees their segments.
    group = f"zombie{os.getpid()}"
    code = (
        "from conveyor.shm.arena import Arena; from conveyor.shm.naming import segment_name; "
        f"Arena(segment_name('{group}', 'worker'), 4096)"
    )
    child = subprocess.Popen([sys.executable, "-c", code])  # not waited for: a zombie once it exits
    try:
        deadline = time.monotonic() + 30
        while not group_segments(group) or _state(child.pid) != "Z":
            assert time.monotonic() < deadline, "the child neither made its segment nor exited"
            time.sleep(0.05)
        assert len(sweep_orphans(group)) == 1 and group_segments(group) == []
    finally:
        child.wait()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_start_sweeps_what_any_killed_group_left_and_nothing_alive() -> None:
    dead, alive = f"gone{os.getpid()}", f"live{os.getpid()}"
    code = (
        "from conveyor.shm.arena import Arena; from conveyor.shm.naming import segment_name; "
        f"Arena(segment_name('{dead}', 'worker'), 4096)"  # its whole group killed: nobody sweeps its name
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    live = Arena(segment_name(alive, "worker"), 4096)
    try:
        swept = sweep_orphans("")
        assert group_segments(dead) == [] and any(name.startswith(f"conveyor.{dead}.") for name in swept)
        assert len(group_segments(alive)) == 1  # its owner (this process) lives
    finally:
        live.close()


def test_preflight_names_the_fix_when_dev_shm_is_small() -> None:
    assert shm_preflight(1) == ""
    assert "--shm-size" in shm_preflight(1 << 60)
