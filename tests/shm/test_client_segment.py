"""Client keys opened as the router and the workers open them (``shm/client_segment.py``):
never blocking, never through a symlink, and only a regular file is a segment. Real
entries in /dev/shm, removed after each test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.shared_memory.client_regions import ClientShmConfig, ClientShmRegistry, look_all
from conveyor.shm.client_segment import open_segment, segment_identity
from tests.support.shm_entries import ShmEntries

LEVEL = "unit"

# A blocking open of a FIFO waits for a writer for ever: the bound turns that hang into a failure.
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def entries() -> Iterator[ShmEntries]:
    with ShmEntries("unit") as made:
        yield made
    assert made.left() == []  # every entry made is gone again


def non_segments(entries: ShmEntries) -> dict[str, str]:
    """Every kind of entry a client may name that is no segment: what, -> its key."""
    made = {
        "fifo": entries.fifo(),
        "socket": entries.unix_socket(),
        "directory": entries.directory(),
        "symlink out of /dev/shm": entries.symlink("/dev/null"),
        "symlink to a segment": entries.symlink(entries.path(entries.segment(64))),
        "file one directory down": entries.nested_segment(),
        "the /dev/shm folder": "/.",
        "its parent": "/..",
        "a NUL": "/a\0b",
        "a lone surrogate": "/\ud800",
    }
    if os.geteuid() == 0:  # mknod needs CAP_MKNOD
        made["character device"] = entries.char_device()
    return made


def test_a_segment_opens_read_only_or_writable(entries: ShmEntries) -> None:
    key = entries.segment(128)
    for writable in (False, True):
        fd, st = open_segment(key, writable)
        try:
            assert st.st_size == 128
            os.pwrite(fd, b"x", 0) if writable else os.pread(fd, 1, 0)
        finally:
            os.close(fd)
    assert segment_identity(key)[0] == 128
    assert segment_identity(key.lstrip("/"))[0] == 128  # glibc's shm_open takes the name without its slash too


def test_anything_but_a_segment_is_refused_at_once(entries: ShmEntries) -> None:
    for what, key in non_segments(entries).items():
        for writable in (False, True):
            with pytest.raises(OSError):  # and not a hang, for the FIFO
                fd, _ = open_segment(key, writable)
                os.close(fd)
                raise AssertionError(f"{what} opened")
        # The client gets Triton's words with its own key, never a path of the server.
        registry = ClientShmRegistry(ClientShmConfig(allow=True))
        with pytest.raises(ConveyorError) as err:
            registry.register_system("r", key, 0, 1)
        assert (err.value.status, err.value.message) == (
            Status.CLIENT_MISTAKE, f"Unable to open shared memory region: '{key}'"), what
        assert len(registry) == 0


def test_the_periodic_check_drops_a_segment_replaced_by_a_fifo(entries: ShmEntries) -> None:
    registry = ClientShmRegistry(ClientShmConfig(allow=True))
    kept, replaced = entries.segment(64), entries.segment(64)
    registry.register_system("kept", kept, 0, 64)
    registry.register_system("replaced", replaced, 0, 64)
    keys = registry.system_keys()
    entries.replace_by_fifo(replaced)
    inodes = look_all(keys)  # not blocked by the FIFO's read-only open
    gone = registry.swept(inodes)
    assert [r["name"] for r in registry.status("system")] == ["kept"]
    assert len(gone) == 1 and gone[0] in inodes and inodes[gone[0]] == -1


def test_a_region_registered_again_during_the_check_is_kept(entries: ShmEntries) -> None:
    """The check runs off the loop: what it found for an old registration must not drop a new one."""
    registry = ClientShmRegistry(ClientShmConfig(allow=True))
    key = entries.segment(64)
    registry.register_system("r", key, 0, 64)
    keys = registry.system_keys()
    registry.unregister("system", "r")
    registry.register_system("r", key, 0, 64)
    assert registry.swept({rid: -1 for rid, _ in keys}) == []
    assert [r["name"] for r in registry.status("system")] == ["r"]
