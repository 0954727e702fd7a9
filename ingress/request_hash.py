"""The response-cache key of a client's request (``proto/request_hash.py``), over the
ingress's own arena: only for models with ``response_cache { enable: true }`` on a
server with a cache. The router, which does not read a client request's tensor bytes,
keys its cache on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from conveyor.proto import messages as m
from conveyor.proto.request_hash import hash_request


def request_hash(refs: list[m.TensorRef], view: Callable[[int, int], np.ndarray], parameters: dict[str, Any]) -> bytes:
    """``hash_request`` over ``view`` (offset, nbytes) of the arena the inputs lie in."""
    return hash_request(refs, lambda ref: view(ref.offset, ref.nbytes), parameters)
