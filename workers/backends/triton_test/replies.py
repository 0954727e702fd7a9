"""One request's responses as Triton's test backends send them: any number, then the final flag
alone (``TRITONBACKEND_ResponseFactorySendFlags``)."""

from __future__ import annotations

from conveyor.proto.errors import ConveyorError, Status, internal
from conveyor.workers.backends.base import RequestItem, RequestOutcome, ResponseChannel


class Replies:
    """A decoupled model's responses leave as they are sent. A model that is not decoupled answers
    once, as Triton's frontends make of what it sends: its one response, with the final flag, or
    Triton's error when it sent none or several."""

    __slots__ = ("_channel", "_count", "_decoupled", "_first", "_first_ns")

    def __init__(self, item: RequestItem, decoupled: bool) -> None:
        if item.channel is None:
            raise internal("a request of a streaming test backend came without its response channel")
        self._channel: ResponseChannel = item.channel
        self._decoupled = decoupled
        self._count = 0
        self._first: RequestOutcome | None = None
        self._first_ns = 0

    @property
    def cancelled(self) -> bool:
        return self._channel.cancelled

    def send(self, outcome: RequestOutcome, output_ns: int = 0, final: bool = False) -> None:
        """One response; ``final``: with the final flag."""
        if self._decoupled:
            self._channel.send(outcome, final, output_ns)
            return
        self._count += 1
        if self._count == 1:
            self._first, self._first_ns = outcome, output_ns
        if final:
            self.finish()

    def finish(self) -> None:
        """The final flag, with no response."""
        if self._decoupled:
            self._channel.send(None, True)
        elif self._count == 1:
            self._channel.send(self._first, True, self._first_ns)
            self._first = None
        else:  # Triton's HTTP frontend's words
            self._channel.send(ConveyorError(Status.INTERNAL, f"expected a single response, got {self._count}"), True)

    def fail(self, error: ConveyorError) -> None:
        """End the request with ``error`` as its final response, unless it has ended already."""
        self._channel.fail(error)
