"""What a systemd template instance name (``%i``) means for one actor.

``conveyor-worker@<i>.service``: ``<i>`` is an index (``0``, ``1``: a worker that
sees every GPU, like the ones ``conveyor serve`` starts) or ``gpu<N>`` (a worker
that sees only GPU ``N``: ``CUDA_VISIBLE_DEVICES=N``).

``conveyor-ingress@<i>.service``: ``<i>`` is ``<protocol>-<index>`` (``http-0``,
``grpc-1``, ``metrics``): the protocol picks the server, the index only tells
instances apart (they share the port through SO_REUSEPORT), so HTTP and gRPC
scale independently.
"""

from __future__ import annotations

import re

from conveyor.proto.errors import invalid_arg

INGRESS_PROTOCOLS = ("http", "grpc", "metrics", "sagemaker", "vertex", "openai")

_WORKER = re.compile(r"(?:\d+|gpu(?P<gpu>\d+))")
_INGRESS = re.compile(r"(?P<protocol>[a-z]+)(?:-\d+)?")


def worker_environment(instance: str) -> dict[str, str]:
    """Environment a worker instance runs with (set before anything initialises CUDA)."""
    match = _WORKER.fullmatch(instance)
    if match is None:
        raise invalid_arg(f"worker instance '{instance}' is neither an index (0, 1, ...) nor gpu<N>")
    gpu = match.group("gpu")
    return {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}


def ingress_protocol(instance: str) -> str:
    match = _INGRESS.fullmatch(instance)
    if match is None or match.group("protocol") not in INGRESS_PROTOCOLS:
        raise invalid_arg(f"ingress instance '{instance}' is not <protocol>-<index> with protocol in "
                          f"{', '.join(INGRESS_PROTOCOLS)}")
    return match.group("protocol")
