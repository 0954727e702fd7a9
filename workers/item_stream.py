"""One request's way back to the router while its model runs.

Every request of a request-backend (Python) batch gets an ``ItemStream``. It
carries the cancellation flag (set by the router's ``CancelItem``; a model sees
it as ``request.is_cancelled()``, and the BLS calls made for the request are
woken through its cancel hooks) and, for a decoupled model, sends each
response as the model produces it, from whichever thread calls ``send``: the
outputs are copied once into this worker's arena and an ``ItemResponse`` goes
to the router through the worker's result queue (the socket's thread sends it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status
from conveyor.workers.backends.base import RequestOutcome, outcome_parameters
from conveyor.workers.batch_io import IoPlan, OutputWriter, plan_request_outputs


class ItemStream:
    """Item ``index`` of ``batch``; ``on_close`` runs once, when it ends."""

    def __init__(
        self,
        batch: int,
        index: int,
        item: m.BatchItem,
        plan: IoPlan,
        writer: OutputWriter,
        post: Callable[[bytes], None],
        on_close: Callable[[ItemStream], None],
    ) -> None:
        self.batch = batch
        self.index = index
        self.item = item
        self.cancelled = False
        self._cancel_hooks: list[Callable[[], None]] | None = None  # BLS calls waiting for it
        self._plan = plan
        self._writer = writer
        self._post = post
        self._on_close = on_close
        # Orders one request's responses when several threads send them.
        self._lock = threading.Lock()
        self._closed = False

    @property
    def key(self) -> tuple[int, int]:
        return (self.batch, self.index)

    @property
    def closed(self) -> bool:
        return self._closed

    def cancel(self) -> None:
        """The client went away (the router's ``CancelItem``, on the main thread)."""
        self.cancelled = True
        if self._cancel_hooks:
            for hook in list(self._cancel_hooks):
                hook()

    def add_cancel_hook(self, hook: Callable[[], None]) -> None:
        if self._cancel_hooks is None:
            self._cancel_hooks = []
        self._cancel_hooks.append(hook)

    def remove_cancel_hook(self, hook: Callable[[], None]) -> None:
        if self._cancel_hooks is not None and hook in self._cancel_hooks:
            self._cancel_hooks.remove(hook)

    def send(self, outcome: RequestOutcome | None, final: bool) -> None:
        """Send one response (``None``: no response, only the final flag).

        Raises ``ConveyorError`` once the request has ended."""
        with self._lock:
            if self._closed:
                raise ConveyorError(Status.INTERNAL, "the request has ended: its final response was sent")
            outputs: list[m.TensorRef] = []
            release: list[m.Release] = []
            error: m.ErrorInfo | None = None
            if isinstance(outcome, ConveyorError):
                error = m.ErrorInfo(int(outcome.status), outcome.message)
            elif outcome is not None:
                planned = plan_request_outputs([self.item], [outcome], self._plan)
                result = self._writer.write(planned)[0]
                outputs, error, release = result.outputs, result.error, result.release
            response = m.ItemResponse(self.batch, self.index, outputs, error, release, final)
            if error is None and (parameters := outcome_parameters(outcome)) is not None:
                response.parameters = parameters
            self._post(m.encode(response))
            if final:
                self._close()

    def fail(self, error: ConveyorError) -> None:
        """End the request with ``error`` unless it has ended already."""
        try:
            self.send(error, True)
        except ConveyorError:
            pass

    def close(self) -> None:
        """End it without a word to the router (which has ended it itself)."""
        with self._lock:
            if not self._closed:
                self._close()

    def _close(self) -> None:
        self._closed = True
        self._on_close(self)
