"""The response-cache key of a request: a hash of its inputs and of the request
parameters that can change its outputs.

The ingress computes it for a client's request right after copying the inputs into
its arena (the bytes are hot in the CPU cache then); the router computes it for an
ensemble's step whose model caches its responses (the step's inputs lie in the
arenas of the steps before it). Both hash alike, so a step and a client's request
to the same model with the same inputs share one entry, as in Triton.
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


def hash_request(refs: list[m.TensorRef], read: Callable[[m.TensorRef], np.ndarray],
                 parameters: dict[str, Any]) -> bytes:
    """128 bits of BLAKE2b over each input's name, datatype, shape and bytes (``read`` gives
    them), in name order, then the output-relevant ``parameters``."""
    h = hashlib.blake2b(digest_size=16)
    for ref in sorted(refs, key=lambda r: r.name):
        h.update(_encode((ref.name, ref.datatype, ref.shape, ref.nbytes)))
        h.update(read(ref).data)
    relevant = {k: v for k, v in parameters.items() if k not in _NOT_IN_KEY}
    if relevant:
        h.update(_encode(relevant))
    return h.digest()
