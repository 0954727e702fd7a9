"""What a client of the router has in flight: requests and control calls, by id.

Every client of the router keeps one: the ingress's ``RouterLink`` (asyncio) and a
worker's ``BlsLink`` (models' BLS calls, from their threads). A request's
responses go to its ``on_response`` up to the final one, when ``on_final`` runs
first (a BLS call frees its input block there). A caller that stops listening
(cancelled, gone) ``redirect``s the rest of its responses elsewhere, so that
their shared memory is still released. ``fail`` answers open requests with an
error when the router that knew them is gone. A callback that raises is logged;
the link goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from conveyor.proto import messages as m

log = logging.getLogger(__name__)

OnResponse = Callable[[m.InferResponse], object]
OnReply = Callable[[m.ControlReply], object]


class _Call:
    __slots__ = ("on_final", "on_response")

    def __init__(self, on_response: OnResponse, on_final: Callable[[], object] | None) -> None:
        self.on_response = on_response
        self.on_final = on_final


class PendingCalls:
    def __init__(self) -> None:
        self._requests: dict[int, _Call] = {}
        self._controls: dict[int, OnReply] = {}

    # --- requests ------------------------------------------------------------------------

    def add(self, rid: int, on_response: OnResponse, on_final: Callable[[], object] | None = None) -> None:
        self._requests[rid] = _Call(on_response, on_final)

    def redirect(self, rid: int, on_response: OnResponse) -> bool:
        """The caller stopped listening: the rest of ``rid``'s responses go to ``on_response``.
        False if ``rid`` has had its final response already."""
        call = self._requests.get(rid)
        if call is None:
            return False
        call.on_response = on_response
        return True

    def deliver(self, msg: m.InferResponse) -> bool:
        """Hand ``msg`` to its request's callback; False if no such request is open (a late
        answer to a request that ended otherwise: failed over, or answered by the router and its worker)."""
        call = self._requests.pop(msg.id, None) if msg.final else self._requests.get(msg.id)
        if call is None:
            return False
        try:
            if msg.final and call.on_final is not None:
                call.on_final()
            call.on_response(msg)
        except Exception:
            log.exception("a response to request %d could not be handed over", msg.id)
        return True

    def fail(self, rids: Iterable[int], error: m.ErrorInfo) -> list[int]:
        """End each of ``rids`` still open with ``error`` (final); the ids that were open."""
        failed = [rid for rid in rids if rid in self._requests]
        for rid in failed:
            self.deliver(m.InferResponse(rid, "", "", error=error))
        return failed

    def open_requests(self) -> list[int]:
        return list(self._requests)

    def __len__(self) -> int:
        return len(self._requests)

    # --- control calls -------------------------------------------------------------------

    def add_control(self, cid: int, on_reply: OnReply) -> None:
        self._controls[cid] = on_reply

    def forget_control(self, cid: int) -> None:
        """The caller gave up waiting: a late reply is dropped."""
        self._controls.pop(cid, None)

    def deliver_control(self, msg: m.ControlReply) -> None:
        on_reply = self._controls.pop(msg.id, None)
        if on_reply is None:
            return
        try:
            on_reply(msg)
        except Exception:
            log.exception("a reply to control call %d could not be handed over", msg.id)

    def fail_controls(self, error: m.ErrorInfo) -> None:
        for cid in list(self._controls):
            self.deliver_control(m.ControlReply(cid, error=error))

    def fail_all(self, error: m.ErrorInfo) -> None:
        self.fail(list(self._requests), error)
        self.fail_controls(error)
