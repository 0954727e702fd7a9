"""Answers the router itself gives a request (it failed before or instead of a worker's
answer), and how a failed request is counted."""

from __future__ import annotations

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError
from conveyor.proto.framing import PeerOutbox
from conveyor.router.models import VersionState
from conveyor.router.registry import ModelRegistry


class Replies:
    """Sends ``InferResponse``s to the ingress socket, stamped with the repository generation."""

    def __init__(self, front: PeerOutbox, registry: ModelRegistry) -> None:
        self.front = front
        self.registry = registry

    def send(self, identity: bytes, resp: m.InferResponse) -> None:
        self.front.send(identity, m.encode(resp))

    def error(self, identity: bytes, rid: int, model: str, version: str, exc: ConveyorError) -> None:
        resp = m.InferResponse(
            rid, model, version, error=m.ErrorInfo(int(exc.status), exc.message),
            generation=self.registry.generation,
        )
        self.front.send(identity, m.encode(resp))


def count_failure(state: VersionState, reason: str, took_ns: int) -> None:
    """Count a failed request (``reason``: Triton's label on nv_inference_request_failure)."""
    state.stats.fail.add(took_ns)
    state.latency.failed(reason)


def count_refused(registry: ModelRegistry, msg: m.Refused) -> None:
    """A request an ingress refused before sending it: a REJECTED failure of the version
    that would have served it (none for an unknown or unready model: nothing to count on)."""
    try:
        state = registry.resolve(msg.model, msg.version)
    except ConveyorError:
        return
    count_failure(state, "REJECTED", 0)
