"""The response-cache key of a request: a hash of its inputs and of the request
parameters that can change its outputs.

The ingress computes it right after copying the inputs into its arena (the
bytes are hot in the CPU cache then), and only for models with
``response_cache { enable: true }`` on a server with a cache: the router, which
never reads tensor bytes, keys its cache on it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

from conveyor.proto import messages as m

# Scheduling only: the same request with another priority or timeout has the same outputs.
_NOT_IN_KEY = frozenset({"priority", "timeout", "triton_enable_empty_final_response"})

_encode = msgspec.msgpack.Encoder(order="sorted").encode


def request_hash(refs: list[m.TensorRef], view: Callable[[int, int], np.ndarray], parameters: dict[str, Any]) -> bytes:
    """128 bits of BLAKE2b over each input's name, datatype, shape and bytes (``view`` of
    the arena), in name order, then the output-relevant ``parameters``."""
    h = hashlib.blake2b(digest_size=16)
    for ref in sorted(refs, key=lambda r: r.name):
        h.update(_encode((ref.name, ref.datatype, ref.shape, ref.nbytes)))
        h.update(view(ref.offset, ref.nbytes).data)
    relevant = {k: v for k, v in parameters.items() if k not in _NOT_IN_KEY}
    if relevant:
        h.update(_encode(relevant))
    return h.digest()
