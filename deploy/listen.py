"""The addresses a group listens on, checked before anything starts, and the exit code of
an ingress that could not listen.

Every ingress binds its port with ``SO_REUSEPORT``, so a second ingress of the group can
share it; but a port another program holds makes the ingress fail at start. Restarting
it would fail the same way, forever (Triton exits at start instead, naming the socket).
So ``conveyor serve`` tries each address first, without ``SO_REUSEPORT`` (which would also
"succeed" beside another reuse-port server, e.g. another Conveyor group, and split its
connections), and an ingress that still loses the race exits with ``LISTEN_FAILED_CODE``:
during start-up the supervisor then stops the whole group (``deploy/supervisor.py``).
"""

from __future__ import annotations

import errno
import socket
from typing import NamedTuple

from conveyor.deploy.settings import Listening, ServeSettings

# What a failed bind or listen raises: the errno (h2, uvicorn) or grpcio's words (no errno).
_BIND_ERRNOS = (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES)


class Endpoint(NamedTuple):
    service: str  # as Triton names it in "failed to start <service> service"
    address: str
    port: int
    flag: str  # the flag that moves it

    def failure(self, exc: BaseException) -> str:
        """One line: Triton's words, the reason, and the flag to change."""
        if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
            reason = "already in use"
        elif isinstance(exc, OSError) and exc.strerror:
            reason = f"cannot be bound: {exc.strerror}"
        else:
            reason = f"cannot be bound: {exc}"
        return (f"failed to start {self.service} service: Unavailable - Socket '{self.address}:{self.port}' "
                f"{reason} (change {self.flag} or stop what holds it)")


def endpoint(a: Listening, protocol: str) -> Endpoint:
    """Where an ingress of ``protocol`` (``deploy/instances.py``'s names) listens."""
    if protocol == "http":
        return Endpoint("HTTP", a.http_address, a.http_port, "--http-port")
    if protocol == "grpc":
        return Endpoint("GRPC", a.grpc_address, a.grpc_port, "--grpc-port")
    if protocol == "metrics":
        return Endpoint("Metrics", a.metrics_address or a.http_address, a.metrics_port, "--metrics-port")
    if protocol == "sagemaker":
        return Endpoint("SageMaker", a.http_address, a.sagemaker_port, "--sagemaker-port")
    if protocol == "vertex":
        return Endpoint("Vertex AI", a.http_address, a.vertex_ai_port, "--vertex-ai-port")
    return Endpoint("OpenAI", a.openai_address or a.http_address, a.openai_port, "--openai-port")


def endpoints(a: ServeSettings) -> list[Endpoint]:
    """Every address ``conveyor serve`` with these flags listens on."""
    serving = {
        "http": a.allow_http and a.http_ingress > 0,
        "grpc": a.allow_grpc and a.grpc_ingress > 0,
        "metrics": a.allow_metrics,
        "sagemaker": a.allow_sagemaker,
        "vertex": a.allow_vertex_ai,
        "openai": bool(a.openai_port) and a.openai_ingress > 0,
    }
    return [endpoint(a, protocol) for protocol, on in serving.items() if on]


def check(where: Endpoint) -> str:
    """Why ``where`` cannot be listened on now, as one line, or ''."""
    try:
        infos = socket.getaddrinfo(where.address or None, where.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return where.failure(exc)
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # SO_REUSEADDR as the ingress sets it: a port left in TIME_WAIT by the last run is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
            probe.listen(1)
        except OSError as exc:
            return where.failure(exc)
    return ""


def check_all(a: ServeSettings) -> list[str]:
    """One line per address of the group that something else holds."""
    return [problem for problem in map(check, endpoints(a)) if problem]


def is_bind_failure(exc: BaseException) -> bool:
    """Whether an exception from starting a server says its address could not be bound."""
    if isinstance(exc, OSError) and exc.errno in _BIND_ERRNOS:
        return True
    # grpcio: RuntimeError("Failed to bind to address ...") or our OSError("cannot bind ...") without errno.
    return isinstance(exc, (OSError, RuntimeError)) and "bind" in str(exc).lower()
