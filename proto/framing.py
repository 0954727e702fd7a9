"""How descriptors travel on the group's ZeroMQ links: several to a message.

One ZeroMQ message carries one or more encoded descriptors, one frame each (a
ROUTER socket adds the peer's identity frame in front). A sender keeps what one
turn of its loop produces for a peer in an outbox and sends it as one message
when the turn ends: a burst of N descriptors then costs one send, one hand-off
to libzmq's I/O thread and one wake-up of the receiver instead of N. A lone
descriptor leaves at the end of the turn that made it; nothing is held back to
wait for company.

Every receive loop of the group drains its socket with ``drain`` or
``drain_peers``: the same cap per turn and the same error policy everywhere (an
undecodable frame is logged and skipped, a handler that raises is logged and the
rest of the message is still handled).

Receives copy: descriptors are small, and below pyzmq's copy threshold a
``bytes`` object is cheaper than a zero-copy ``Frame``. Each frame is still
received as a ``Frame`` and copied out of it: pyzmq fills ``Frame.more`` in C,
where asking ``ZMQ_RCVMORE`` with ``Socket.get`` builds a ``SocketOption`` enum
member per call (0.8 µs against 0.5 µs a frame). A ROUTER socket's message
always holds its peer's identity and at least one frame after it: the identity
is received as ``bytes``, its ``more`` not asked.

Sends and receives call pyzmq's compiled ``Socket`` methods with plain-int
flags: its Python ``send_multipart``/``recv_multipart`` type-check each frame
and combine ``IntFlag`` members (about 2 µs a message), and ending a drain on
``zmq.Again`` built an exception per loop turn; ``ZMQ_EVENTS`` answers the
same question (it also resets the edge-triggered ``FD`` the ingress waits on).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

import msgspec
import zmq

log = logging.getLogger(__name__)

T = TypeVar("T")

# ZeroMQ messages taken per socket per loop turn: under load other sockets get their turn too.
DRAIN_CAP = 256

_send = zmq.backend.Socket.send
_recv = zmq.backend.Socket.recv
# An int option answers an int (typed once here: no ``cast`` call per question on the hot path).
_getsockopt = cast(Callable[[Any, int], int], zmq.backend.Socket.get)
_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.SNDMORE)
_MORE_NOBLOCK = _MORE | _NOBLOCK
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


def send_frames(sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
    """``sock.send_multipart(frames, zmq.NOBLOCK)`` (raises ``zmq.Again`` alike), cheaper."""
    last = len(frames) - 1
    for i in range(last):
        _send(sock, frames[i], _MORE_NOBLOCK)
    _send(sock, frames[last], _NOBLOCK)


def recv_frames(sock: zmq.Socket[bytes]) -> list[bytes]:
    """``sock.recv_multipart(zmq.NOBLOCK)`` (raises ``zmq.Again`` alike), cheaper."""
    frame = _recv(sock, _NOBLOCK, False)
    frames = [frame.bytes]
    while frame.more:
        frame = _recv(sock, _NOBLOCK, False)
        frames.append(frame.bytes)
    return frames


def _recv_peer_frames(sock: zmq.Socket[bytes]) -> list[bytes]:
    """``recv_frames`` for a ROUTER socket: its identity frame is never the last."""
    frames = [_recv(sock, _NOBLOCK)]
    frame = _recv(sock, _NOBLOCK, False)
    frames.append(frame.bytes)
    while frame.more:
        frame = _recv(sock, _NOBLOCK, False)
        frames.append(frame.bytes)
    return frames


def readable(sock: zmq.Socket[bytes]) -> bool:
    """Whether a message waits (``ZMQ_EVENTS``)."""
    return bool(_getsockopt(sock, _EVENTS) & _POLLIN)


class Outbox:
    """The descriptors one loop turn produced for the one peer of a DEALER or PUSH socket."""

    __slots__ = ("_frames", "sock")

    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self.sock = sock
        self._frames: list[bytes] = []

    def __len__(self) -> int:
        return len(self._frames)

    def send(self, payload: bytes) -> None:
        self._frames.append(payload)

    def flush(self) -> bool:
        """Send what accumulated as one message (never blocks: the sockets have no high-water mark
        that could refuse it, or a refused message is dropped because its peer is gone). True when it
        sent (a poll then asks the socket again: ``deploy/runtime/polling.py``)."""
        if not self._frames:
            return False
        frames, self._frames = self._frames, []
        try:
            send_frames(self.sock, frames)
        except zmq.Again:
            log.warning("dropped %d descriptor(s): the peer is not taking messages", len(frames))
        return True


class PeerOutbox:
    """The descriptors one loop turn produced for each peer of a ROUTER socket."""

    __slots__ = ("_frames", "sock")

    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self.sock = sock
        self._frames: dict[bytes, list[bytes]] = {}

    def send(self, identity: bytes, payload: bytes) -> None:
        frames = self._frames.get(identity)
        if frames is None:
            self._frames[identity] = [payload]
        else:
            frames.append(payload)

    def flush(self) -> bool:
        """One message per peer. A ROUTER drops what it cannot route (a peer gone): nothing blocks.
        True when it sent (a poll then asks the socket again: ``deploy/runtime/polling.py``)."""
        if not self._frames:
            return False
        pending, self._frames = self._frames, {}
        sock = self.sock
        for identity, frames in pending.items():
            _send(sock, identity, _MORE)
            for i in range(len(frames) - 1):
                _send(sock, frames[i], _MORE)
            _send(sock, frames[-1], 0)
        return True


def drain(
    sock: zmq.Socket[bytes], decode: Callable[[bytes], T], handle: Callable[[T], Any], source: str,
    cap: int = DRAIN_CAP,
) -> bool:
    """Handle every descriptor waiting on a DEALER/PULL socket, up to ``cap`` messages.
    True when the cap stopped it (more may wait: come back after other work)."""
    for _ in range(cap):
        try:
            frames = recv_frames(sock)
        except zmq.Again:  # the first receive only: the later ones ask ``readable`` first
            return False
        for frame in frames:
            _handle_one(frame, decode, handle, source)
        if not readable(sock):
            return False
    return True


def drain_peers(
    sock: zmq.Socket[bytes], decode: Callable[[bytes], T], handle: Callable[[bytes, T], Any], source: str,
    cap: int = DRAIN_CAP,
) -> bool:
    """``drain`` for a ROUTER socket: ``handle(identity, message)`` for each descriptor."""
    for _ in range(cap):
        try:
            frames = _recv_peer_frames(sock)
        except zmq.Again:  # the first receive only: the later ones ask ``readable`` first
            return False
        identity = frames[0]
        for i in range(1, len(frames)):
            try:
                msg = decode(frames[i])
            except msgspec.DecodeError as exc:  # ValidationError included
                log.error("undecodable message from %s: %s", source, exc)
                continue
            try:
                handle(identity, msg)
            except Exception:
                log.exception("failed to handle a message from %s", source)
        if not readable(sock):
            return False
    return True


def _handle_one(frame: bytes, decode: Callable[[bytes], T], handle: Callable[[T], Any], source: str) -> None:
    try:
        msg = decode(frame)
    except msgspec.DecodeError as exc:  # ValidationError included
        log.error("undecodable message from %s: %s", source, exc)
        return
    try:
        handle(msg)
    except Exception:
        log.exception("failed to handle a message from %s", source)
