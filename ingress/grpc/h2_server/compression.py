"""A compressed request message (its flag byte's bit 0, ``grpc-encoding`` gzip or deflate) inflated a
step at a time: past the message limit it is refused as gRPC refuses it, and each step is charged to
the connection's budgets beyond the wire bytes it replaces, so a bomb costs no more than a message that
size sent plain."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from conveyor.ingress.grpc.h2_server.messages import DECOMPRESSED_TOO_LARGE
from conveyor.ingress.inflate import Inflate, InflatedTooLarge, TrailingBytes, Truncated

_INTERNAL, _RESOURCE_EXHAUSTED = 13, 8
# The encodings a request may name (grpc-encoding), by zlib's window bits for each container.
WBITS = {"gzip": 31, "deflate": 15}


class Undecodable(Exception):
    """The message cannot be inflated: its call ends with this status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def inflated(message: Any, encoding: str, limit: int, held: int, charge: Callable[[int], bool]) -> bytes | None:
    """``message`` inflated; ``held``: its bytes on the wire, charged already; ``charge(n)`` takes ``n``
    more bytes of the budgets (negative: gives them back), False when it ended the call instead (then
    None). The message returned holds its own size of the budgets. Raises ``Undecodable``."""
    wbits = WBITS.get(encoding)
    if wbits is None:
        raise Undecodable(_INTERNAL, "a compressed message without grpc-encoding")
    inflate = Inflate(wbits, limit)
    inflate.give(message)
    credit = held
    try:
        while inflate.more:
            made = inflate.step()
            covered = min(credit, made)
            credit -= covered
            if made > covered and not charge(made - covered):
                return None
        out = inflate.finish()
    except InflatedTooLarge:
        raise Undecodable(_RESOURCE_EXHAUSTED, DECOMPRESSED_TOO_LARGE) from None
    except Truncated:
        raise Undecodable(_INTERNAL, "cannot decompress the message: the compressed stream is truncated") from None
    except TrailingBytes:
        raise Undecodable(_INTERNAL, "cannot decompress the message: bytes after the end of the compressed "
                                     "stream") from None
    except zlib.error as err:
        raise Undecodable(_INTERNAL, f"cannot decompress the message: {err}") from None
    if credit:  # it inflated to less than it came as
        charge(-credit)
    return out
