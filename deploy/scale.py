"""``conveyor scale ROLE [N]``: change how many workers or ingress processes a running
``conveyor serve`` runs.

The supervisor listens on a unix stream socket in the group's run folder
(``<run dir>/supervisor.sock``, mode 0600: only its own user may scale it). One
request per connection, one JSON line each way::

    -> {"role": "workers", "count": 3}        (count omitted: just report)
    <- {"ok": true, "counts": {"workers": 3, "http-ingress": 1, "grpc-ingress": 1}}
    <- {"ok": false, "error": "..."}

Under systemd the units are the processes: scale with ``systemctl`` instead
(docs/DEPLOY.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable
from typing import Any

from conveyor.deploy.options import run_dir
from conveyor.proto.errors import ConveyorError, invalid_arg, unavailable

ROLES = ("workers", "http-ingress", "grpc-ingress", "openai-ingress")
REQUEST_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 4096

# Handles one request: (role or "", count or None) -> counts per role.
ScaleHandler = Callable[[str, int | None], dict[str, int]]


def socket_path(group: str) -> str:
    return os.path.join(run_dir(group), "supervisor.sock")


def _reply(conn: socket.socket, doc: dict[str, Any]) -> None:
    conn.sendall(json.dumps(doc).encode() + b"\n")


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while b"\n" not in data and len(data) < MAX_REQUEST_BYTES:
        chunk = conn.recv(MAX_REQUEST_BYTES)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]


def parse_request(line: bytes) -> tuple[str, int | None]:
    try:
        doc = json.loads(line)
    except ValueError:
        raise invalid_arg("the request is not JSON") from None
    role, count = doc.get("role", ""), doc.get("count")
    if role and role not in ROLES:
        raise invalid_arg(f"unknown role '{role}': one of {', '.join(ROLES)}")
    if count is not None and (not isinstance(count, int) or count < 0 or not role):
        raise invalid_arg("count must be a whole number >= 0, with a role")
    return role, count


class ScaleServer:
    """The supervisor's end: a non-blocking listener its loop polls with ``serve_pending``."""

    def __init__(self, path: str, handle: ScaleHandler) -> None:
        self.path = path
        self._handle = handle
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by a supervisor that was killed
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # created 0600, never briefly open to others
        try:
            self.sock.bind(path)
        finally:
            os.umask(old_umask)
        self.sock.listen(8)
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def serve_pending(self) -> None:
        """Answer every connection waiting now."""
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return
            with conn:
                conn.settimeout(REQUEST_TIMEOUT_S)  # a stuck client cannot hold the supervisor long
                try:
                    role, count = parse_request(_read_line(conn))
                    _reply(conn, {"ok": True, "counts": self._handle(role, count)})
                except ConveyorError as exc:
                    _reply(conn, {"ok": False, "error": exc.message})
                except OSError:
                    pass  # the client went away

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def request_scale(group: str, role: str = "", count: int | None = None) -> dict[str, int]:
    """Ask the supervisor of ``group`` to run ``count`` processes of ``role``; returns the counts."""
    path = socket_path(group)
    doc: dict[str, Any] = {"role": role}
    if count is not None:
        doc["count"] = count
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(REQUEST_TIMEOUT_S)
            sock.connect(path)
            sock.sendall(json.dumps(doc).encode() + b"\n")
            reply = json.loads(_read_line(sock) or b"{}")
    except (OSError, ValueError) as exc:
        raise unavailable(f"no 'conveyor serve' of group '{group}' answers on {path}: {exc}") from None
    if not reply.get("ok"):
        raise invalid_arg(reply.get("error", "the supervisor gave no answer"))
    counts: dict[str, int] = reply["counts"]
    return counts
