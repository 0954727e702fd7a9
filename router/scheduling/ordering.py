"""``preserve_ordering``: a model version's responses leave in the order its
requests were sent to the model, even when several instances finish out of
order — a response that is ready early waits for the ones before it.

Triton allows it only with one priority level and no DELAY policy, so that
order is the arrival order. Requests answered from the queue (timed out,
cancelled, refused) never ran and are not held back, nor do they hold others.
"""

from __future__ import annotations


class ResponseOrder:
    def __init__(self) -> None:
        self._issued = 0  # tickets handed out, in dispatch order
        self._sent = 0  # tickets whose responses have left
        self._held: dict[int, tuple[bytes, bytes]] = {}

    def ticket(self) -> int:
        ticket = self._issued
        self._issued += 1
        return ticket

    def release(self, ticket: int, identity: bytes, payload: bytes) -> list[tuple[bytes, bytes]]:
        """The responses that may leave now that ``ticket``'s is ready, in order."""
        if ticket != self._sent:
            self._held[ticket] = (identity, payload)
            return []
        out = [(identity, payload)]
        self._sent += 1
        held = self._held
        while self._sent in held:
            out.append(held.pop(self._sent))
            self._sent += 1
        return out

    @property
    def held(self) -> int:
        return len(self._held)
