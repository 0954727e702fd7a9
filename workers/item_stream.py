"""One request's way back to the router while its model runs.

Every request of a request-backend (Python) batch gets an ``ItemStream``. It
carries the cancellation flag (set by the router's ``CancelItem``; a model sees
it as ``request.is_cancelled()``, and the BLS calls made for the request are
woken through its cancel hooks) and, for a decoupled model, sends each
response as the model produces it, from whichever thread calls ``send``: the
outputs are copied once into this worker's arena and the response goes out
through the worker's result queue (the socket's thread sends it).

Where it goes: a request the router marked ``reply_to`` is answered straight to
its ingress (an ``InferResponse`` per response), and the router, which counts
them, gets an ``ItemResponsesSent`` after the first response, with the final
one, and in between at most every ``NOTE_INTERVAL_NS``: a token costs the
router nothing. Any other request's responses go to the router as
``ItemResponse``s, which it forwards. A backend whose responses come from an
event loop of its own may have the direct ones sent from that loop
(``reply_from``, ``workers/loop_replies.py``) instead of the worker's main loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status, WorkerLost
from conveyor.workers.backends.base import RequestOutcome, outcome_parameters
from conveyor.workers.batch_io import IoPlan, OutputWriter, plan_request_outputs
from conveyor.workers.loop_replies import LoopReplies

# How stale the router's count of a long direct stream may get (its statistics, not the client's tokens).
NOTE_INTERVAL_NS = 250_000_000


class ItemStream:
    """Item ``index`` of ``msg``; ``post`` sends (destination, payload) pairs ("" = the router);
    ``on_close`` runs once, when it ends."""

    # One per request of every Python batch: slots make it cheaper to build and to read.
    __slots__ = (
        "_cancel_hooks", "_closed", "_counts", "_direct", "_exec", "_held", "_last_ns", "_lock",
        "_loop_replies", "_noted", "_noted_ns", "_on_close", "_plan", "_post", "_writer", "batch", "cancelled",
        "holding", "index", "item", "key",
    )

    def __init__(
        self,
        msg: m.ExecBatch,
        index: int,
        plan: IoPlan,
        writer: OutputWriter,
        post: Callable[[list[tuple[str, bytes]]], None],
        on_close: Callable[[ItemStream], None],
        holding: bool = False,
    ) -> None:
        self.batch = msg.batch
        self.index = index
        self.key = (msg.batch, index)  # its entry in the runner's streams
        self.item = item = msg.items[index]
        self._exec = msg
        # Direct: the responses' times since the last note to the router, and when that note went.
        self._counts: list[m.ResponseCount] = []
        self._last_ns = self._noted_ns = time.monotonic_ns()
        self._noted = False
        self._direct = item.reply_to
        self._loop_replies: LoopReplies | None = None
        self.cancelled = False
        self._cancel_hooks: list[Callable[[], None]] | None = None  # BLS calls waiting for it
        self._plan = plan
        self._writer = writer
        self._post = post
        self._on_close = on_close
        # Orders one request's responses when several threads send them.
        self._lock = threading.Lock()
        self._closed = False
        # hold() (or ``holding``): what is sent before the batch's result left waits for it (release()).
        # A plain attribute, read once per request by the runner.
        self.holding = holding
        self._held: list[tuple[str, bytes]] = []

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

    def reply_from(self, replies: LoopReplies) -> None:
        """Send the direct responses through ``replies``: every later ``send`` comes from its loop."""
        self._loop_replies = replies

    def hold(self) -> None:
        """Keep what is sent until ``release``: a request of a model that is not decoupled
        may be answered after execute (``AnsweredLater``) by another thread, before the
        batch's ``BatchResult`` (which tells the router to wait for that answer) has left."""
        self.holding = True

    def release(self) -> None:
        """The batch's result has been posted: send what was held, and from now on at once."""
        with self._lock:
            held, self._held, self.holding = self._held, [], False
        if held:
            self._post(held)

    def _post_or_hold(self, out: list[tuple[str, bytes]]) -> None:
        if self.holding:
            self._held.extend(out)
        else:
            self._post(out)

    def send(self, outcome: RequestOutcome | None, final: bool, output_ns: int = 0) -> None:
        """Send one response (``None``: no response, only the final flag); ``output_ns``: the model's
        own time producing its outputs (``ResponseChannel.send``), counted with the time writing them.

        Raises ``ConveyorError`` once the request has ended."""
        with self._lock:
            if self._closed:
                raise ConveyorError(Status.INTERNAL, "the request has ended: its final response was sent")
            outputs: list[m.TensorRef] = []
            release: list[m.Release] = []
            error: m.ErrorInfo | None = None
            model_ns = output_ns
            if isinstance(outcome, ConveyorError):
                # WorkerLost: not the request's fault (its engine died): an ingress may move it (ingress/migration.py)
                error = m.ErrorInfo(int(outcome.status), outcome.message, isinstance(outcome, WorkerLost))
            elif outcome:  # tensors to write (a response of parameters alone has none: nothing to plan)
                start = time.monotonic_ns()
                planned = plan_request_outputs([self.item], [outcome], self._plan)
                result = self._writer.write(planned)[0]
                outputs, error, release = result.outputs, result.error, result.release
                output_ns += time.monotonic_ns() - start
            parameters = outcome_parameters(outcome) if error is None else None
            if self._direct:
                self._answer(outputs, error, release, final, parameters, output_ns, model_ns > 0)
            else:
                response = m.ItemResponse(self.batch, self.index, outputs, error, release, final)
                if parameters is not None:
                    response.parameters = parameters
                self._post_or_hold([("", m.encode(response))])
            if final:
                self._close()

    def _answer(
        self,
        outputs: list[m.TensorRef],
        error: m.ErrorInfo | None,
        release: list[m.Release],
        final: bool,
        parameters: dict[str, object] | None,
        output_ns: int,
        produced: bool = False,
    ) -> None:
        """One response straight to the ingress, and the router's note when one is due; ``produced``:
        the model timed producing outputs for it (a failed response that did counts as one with outputs)."""
        msg = self._exec
        response = m.encode(m.InferResponse(self.item.id, msg.model, msg.version, outputs, error, release, final,
                                            parameters or {}, msg.generation))
        out: list[tuple[str, bytes]] = []
        if self._loop_replies is not None:
            self._loop_replies.send(self._direct, response)
        else:
            out.append((self._direct, response))
        now = time.monotonic_ns()
        self._counts.append(m.ResponseCount(now - self._last_ns, output_ns, error.status if error else 0,
                                            bool(outputs or parameters or produced), error is not None))
        self._last_ns = now
        if final or not self._noted or now - self._noted_ns >= NOTE_INTERVAL_NS:
            note = m.ItemResponsesSent(self.batch, self.index, self._counts, final, error if final else None)
            out.append(("", m.encode(note)))
            self._counts = []
            self._noted = True
            self._noted_ns = now
        if out:
            self._post_or_hold(out)

    def fail(self, error: ConveyorError) -> None:
        """End the request with ``error`` unless it has ended already."""
        try:
            self.send(error, True)
        except ConveyorError:
            pass

    def close(self) -> None:
        """End it without a word to the router (which has ended it itself)."""
        with self._lock:
            if not self._closed:  # ``_close``, inlined: once per request
                self._closed = True
                self._on_close(self)

    def _close(self) -> None:
        self._closed = True
        self._on_close(self)
