"""The client shared-memory registry: regions clients registered, by name.

Owned by the router so that every ingress process sees one namespace (a client
may register through one ingress and infer through another). The router never
maps a client region: it checks the segment at registration (``look``, and every
``SHM_SWEEP_INTERVAL_S`` ``look_all``: on the repository agent's threads, never on the
loop, as a key may name a FIFO or worse), rewrites requests
that name a region into absolute refs with a registration id, and hands the
``ClientRegion`` descriptors to the worker with the batch. Workers map lazily and
unmap on ``ForgetRegions`` (unregister, or the segment disappeared).

System and CUDA regions share one namespace, as in Triton.
"""

from __future__ import annotations

import errno
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status, client_mistake, invalid_arg, not_found
from conveyor.shm.client_segment import segment_identity
from conveyor.shm.naming import PREFIX as SEGMENT_PREFIX

log = logging.getLogger(__name__)

PREFIX = m.CLIENT_REGION_PREFIX
# Triton's kTritonSharedMemoryRegionPrefix (its python backend's own segments): refused as a
# client key. Conveyor's own segments (``conveyor.``, shm/naming.py) are refused the same way.
RESERVED_KEY_PREFIXES = ("triton_python_backend_shm_region_", SEGMENT_PREFIX)
SIZE_MAX = (1 << 64) - 1  # Triton's size_t, in its overflow message
CUDA_IPC_HANDLE_BYTES = 64
# Registrations held at once (system and CUDA together): each costs the router a
# sweep check every 5 s and each worker a mapping, so a client cannot pile them up.
DEFAULT_MAX_REGIONS = 1024


def disabled() -> ConveyorError:
    # Triton's kClientShmDisabledErrorStr (src/common.h), UNSUPPORTED: 501 / UNIMPLEMENTED.
    return ConveyorError(
        Status.UNSUPPORTED,
        "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.",
    )


def _invalid_args(name: str) -> ConveyorError:
    return invalid_arg(f"failed to register shared memory region '{name}': invalid args")


def _check_key(name: str, key: str) -> None:
    """Triton's ValidateSharedMemoryKey (src/common.cc), with Conveyor's own prefix reserved too."""
    bare = key.lstrip("/")
    if not bare:
        raise invalid_arg(f"cannot register shared memory region '{name}' - invalid shm key '{key}'")
    for prefix in RESERVED_KEY_PREFIXES:
        if bare.startswith(prefix):
            raise invalid_arg(
                f"cannot register shared memory region '{name}' with key '{key}' as the key contains the reserved "
                f"prefix '{prefix}'"
            )


@dataclass(slots=True)
class Registration:
    region: m.ClientRegion
    inode: int = 0  # system: the segment's inode at registration, to notice it was replaced
    awaiting_unregister: bool = False  # unregistered while requests that use it were in flight


def _nothing_in_use() -> set[int]:
    return set()


@dataclass(frozen=True)
class ClientShmConfig:
    """The client shared-memory flags, parsed (``--allow-client-shm``, ``--max-client-shm-regions``)."""

    allow: bool = False  # off by default, as in Triton: a client may name any segment the server's user can open
    max_regions: int = DEFAULT_MAX_REGIONS  # 0: no limit


class ClientShmRegistry:
    def __init__(self, config: ClientShmConfig) -> None:
        self.allow = config.allow
        self.max_regions = config.max_regions  # 0: no limit
        self.cuda_devices: set[int] = set()  # GPUs some worker has; kept current by the router
        self._by_name: dict[str, Registration] = {}
        self._ids = itertools.count(1)
        # The registration ids that queued or running requests use (set by the router's
        # admission): an unregistered region stays until they are done, as in Triton.
        self.in_use: Callable[[], set[int]] = _nothing_in_use
        self._awaiting = 0

    def __len__(self) -> int:
        return len(self._by_name)

    # --- registration ------------------------------------------------------------------

    def check_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """What can be said of a system registration before its key is opened (``look``, off the
        router's loop), in Triton's order (RegisterSystemSharedMemory): the key, then the name."""
        if not self.allow:
            raise disabled()
        if not name:
            raise invalid_arg("'region name' is necessary to register system shared memory region")
        _check_key(name, key)
        self._check_new(name, offset, byte_size)

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Check, open and register in the caller's thread (tests and tools; the router's loop
        never: its ``shm_register`` opens the key on the agent's thread)."""
        self.check_system(name, key, offset, byte_size)
        try:
            looked: tuple[int, int] | Exception = look(key)
        except ConveyorError as exc:
            looked = exc
        self.add_system(name, key, offset, byte_size, looked)

    def add_system(self, name: str, key: str, offset: int, byte_size: int,
                   looked: tuple[int, int] | Exception) -> None:
        """Register with what ``look(key)`` found: the segment's size and inode, or why it cannot be
        opened. The name is checked again: another registration may have taken it meanwhile."""
        self._check_new(name, offset, byte_size)
        if isinstance(looked, ConveyorError):
            raise looked
        if isinstance(looked, Exception):  # not ``look``'s own: logged, refused as any unopenable key
            log.warning("shared memory key '%s': %r", key, looked)
            raise client_mistake(f"Unable to open shared memory region: '{key}'")
        size, inode = looked
        if offset + byte_size > size:
            log.info("shared memory region '%s': offset %d + byte_size %d is beyond the end of segment '%s' "
                     "(%d bytes)", name, offset, byte_size, key, size)
            raise _invalid_args(name)
        if byte_size == 0:  # Triton's mmap of 0 bytes fails with EINVAL, and says so this way
            raise invalid_arg(
                f"failed to register shared memory region '{name}': unable to process address spaceInvalid argument"
            )
        region = m.ClientRegion(next(self._ids), name, "system", key=key, offset=offset, byte_size=byte_size)
        self._by_name[name] = Registration(region, inode)

    def register_cuda(self, name: str, handle: bytes, device_id: int, byte_size: int) -> None:
        if not self.allow:
            raise disabled()
        if device_id not in self.cuda_devices:
            raise ConveyorError(
                Status.UNSUPPORTED,
                f"CUDA shared memory is unavailable: no worker of this server has CUDA device {device_id} "
                "(no GPU, or cupy is not installed: pip install 'conveyor[gpu]')",
            )
        self._check_new(name, 0, byte_size)
        if len(handle) != CUDA_IPC_HANDLE_BYTES:
            raise invalid_arg(
                f"'raw_handle' must be a {CUDA_IPC_HANDLE_BYTES}-byte cudaIpcMemHandle_t, got {len(handle)} bytes"
            )
        region = m.ClientRegion(next(self._ids), name, "cuda", byte_size=byte_size, device_id=device_id,
                                handle=handle)
        self._by_name[name] = Registration(region)

    def _check_new(self, name: str, offset: int, byte_size: int) -> None:
        if not self.allow:
            raise disabled()
        if not name:
            raise invalid_arg("'region name' is necessary to register cuda shared memory region")
        if name in self._by_name:
            raise ConveyorError(Status.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        if self.max_regions and len(self._by_name) >= self.max_regions:
            raise ConveyorError(
                Status.UNAVAILABLE,
                f"failed to register shared memory region '{name}': {len(self._by_name)} regions are registered, "
                f"the most this server holds (--max-client-shm-regions); unregister some first",
            )
        if offset < 0 or byte_size < 0:
            raise _invalid_args(name)

    def unregister(self, kind: str, name: str = "") -> list[int]:
        """Drop ``name`` (or every region of ``kind``); returns the ids workers must forget.
        An unknown name is no error, as in Triton. A region that requests in flight use is
        dropped once they are done (Triton's "awaiting unregister"): until then it is still
        listed, and new requests may still use it."""
        if not self.allow:
            raise disabled()
        names = [name] if name else [n for n, r in self._by_name.items() if r.region.kind == kind]
        in_use = self.in_use() if names else set()
        gone: list[int] = []
        for n in names:
            reg = self._by_name.get(n)
            if reg is None or reg.region.kind != kind:
                continue
            if reg.region.id in in_use:
                self._awaiting += not reg.awaiting_unregister
                reg.awaiting_unregister = True
                continue
            self._drop(n, reg)
            gone.append(reg.region.id)
        return gone

    def settle(self) -> list[int]:
        """Drop the regions awaiting unregistration that no request uses any more; returns
        the ids workers must forget."""
        if not self._awaiting:
            return []
        in_use = self.in_use()
        gone: list[int] = []
        for n, reg in list(self._by_name.items()):
            if reg.awaiting_unregister and reg.region.id not in in_use:
                self._drop(n, reg)
                gone.append(reg.region.id)
        return gone

    def _drop(self, name: str, reg: Registration) -> None:
        del self._by_name[name]
        self._awaiting -= reg.awaiting_unregister

    def status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        """Allowed while client shared memory is disabled (then empty), as in Triton."""
        if name:
            reg = self._by_name.get(name)
            if reg is None:
                label = "system" if kind == "system" else "cuda"
                raise not_found(f"Unable to find {label} shared memory region: '{name}'")
            if reg.region.kind != kind:
                held, asked = ("CUDA", "system") if reg.region.kind == "cuda" else ("system", "CUDA")
                raise not_found(f"The region named '{name}' is registered as {held} shared memory, not {asked} "
                                "shared memory")
            regs = [reg.region]
        else:
            regs = [r.region for r in self._by_name.values() if r.region.kind == kind]
        if kind == "system":
            return [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regs]
        return [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regs]

    def system_keys(self) -> list[tuple[int, str]]:
        """(registration id, key) of every system region: what the periodic check (``look_all``,
        off the loop) opens."""
        return [(r.region.id, r.region.key) for r in self._by_name.values() if r.region.kind == "system"]

    def swept(self, inodes: dict[int, int]) -> list[int]:
        """Drop the system regions whose segment ``look_all`` found removed or replaced (a client
        that died without unregistering, or a FIFO put in its place); returns the ids workers
        must forget. A region registered or dropped since the check started is left alone."""
        gone: list[int] = []
        for name, reg in list(self._by_name.items()):
            inode = inodes.get(reg.region.id)
            if inode is not None and inode != reg.inode:
                self._drop(name, reg)
                gone.append(reg.region.id)
        return gone

    # --- requests ------------------------------------------------------------------------

    def resolve(self, req: m.InferRequest) -> None:
        """Rewrite ``req``'s region names into registration ids and absolute offsets,
        checking each range against its region; the descriptors go into ``req.regions``."""
        used: dict[int, m.ClientRegion] = {}
        inputs = req.inputs
        for i, ref in enumerate(inputs):
            if ref.region.startswith(PREFIX):
                region = self._range(ref.region[1:], ref.offset, ref.nbytes, used)
                inputs[i] = m.TensorRef(ref.name, ref.datatype, ref.shape, f"{PREFIX}{region.id}",
                                        region.offset + ref.offset, ref.nbytes)
        outputs = req.outputs
        for i, out in enumerate(outputs):
            if out.region:
                region = self._range(out.region, out.offset, out.nbytes, used)
                outputs[i] = m.OutputSpec(out.name, out.classification, f"{PREFIX}{region.id}",
                                          region.offset + out.offset, out.nbytes)
        req.regions = list(used.values())

    def _range(self, name: str, offset: int, nbytes: int, used: dict[int, m.ClientRegion]) -> m.ClientRegion:
        # Triton's checks and words (SharedMemoryManager::GetMemoryInfo), in its order.
        reg = self._by_name.get(name)
        if reg is None:
            raise not_found(f"Unable to find shared memory region: '{name}'")
        region = reg.region
        if offset < 0 or offset >= region.byte_size:
            raise invalid_arg(f"Invalid offset for shared memory region: '{name}'")
        if nbytes > SIZE_MAX - offset:
            raise invalid_arg(
                f"Integer overflow detected: byte_size ({nbytes}) + offset ({offset}) exceeds maximum value "
                f"({SIZE_MAX}) for region '{name}'"
            )
        if nbytes < 0 or offset + nbytes > region.byte_size:
            raise invalid_arg(f"Invalid offset + byte size for shared memory region: '{name}'")
        used[region.id] = region
        return region


# Why a key could not be opened, for the server's log (the client gets Triton's words alone).
_REASONS = {
    errno.ENOENT: "no such segment",
    errno.EACCES: "permission denied for the server's user",
    errno.EPERM: "permission denied for the server's user",
    errno.ELOOP: "a symbolic link (never followed, as by shm_open)",
    errno.ENXIO: "a socket",
    errno.EWOULDBLOCK: "another process holds a lease on it",
    errno.EISDIR: "a directory",
}


def look(key: str) -> tuple[int, int]:
    """The size and inode of POSIX segment ``key`` (``shm/client_segment.py``: opened read-only
    without blocking, refused unless a regular file, closed again). Run off the router's loop.

    Any failure is Triton's "Unable to open shared memory region" with the key as the client gave
    it, and Triton's status (INTERNAL, 500; 400 with --client-mistakes-as-400); the reason is logged.
    """
    try:
        return segment_identity(key)
    except OSError as exc:
        log.info("shared memory key %r: %s", key, _REASONS.get(exc.errno or 0, exc.strerror))
        raise client_mistake(f"Unable to open shared memory region: '{key}'") from None


def look_all(keys: list[tuple[int, str]]) -> dict[int, int]:
    """Registration id -> inode of its segment now (-1: it cannot be opened, or is no segment any
    more): the periodic check, run off the router's loop."""
    inodes: dict[int, int] = {}
    for rid, key in keys:
        try:
            inodes[rid] = segment_identity(key)[1]
        except OSError:
            inodes[rid] = -1
    return inodes
