"""Triton's TensorFlow backend parameters (its ``src/tensorflow.cc`` ParseParameters), read once at load:

* ``TF_NUM_INTRA_THREADS`` (non-negative), ``TF_NUM_INTER_THREADS``: TensorFlow's thread pools;
* ``TF_GRAPH_TAG`` (default ``serve``) and ``TF_SIGNATURE_DEF`` (default ``serving_default``):
  which MetaGraph and signature of a SavedModel serve;
* ``TF_USE_PER_SESSION_THREADS``, ``MAX_SESSION_SHARE_COUNT`` (positive), ``TF_INIT_OPS_FILE``: read
  and checked; TensorFlow 2's eager runtime has no sessions to share or initialise that way.

TensorFlow 2 sizes its thread pools once per process, before it runs anything: in a worker hosting
several TensorFlow models the first one loaded decides them (Triton: per session). Unset, the
intra-op pool gets Conveyor's CPU default (``workers/backends/cpu_threads.py``; TensorFlow's own
is every core) and the inter-op pool one thread less than that (at least 1).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_flag, parameter_text
from conveyor.proto.errors import invalid_arg
from conveyor.workers.backends.cpu_threads import default_threads

log = logging.getLogger(__name__)


def _int(config: mc.ModelConfig, key: str, minimum: int, what: str) -> int | None:
    text = parameter_text(config, key)
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise invalid_arg(f"parameter '{key}' must be an integer for TensorFlow model '{config.name}', "
                          f"not '{text}'") from None
    if value < minimum:
        raise invalid_arg(f"parameter '{key}' must be {what} number for TensorFlow model '{config.name}'")
    return value


@dataclass(frozen=True, slots=True)
class TensorFlowSettings:
    intra_op_threads: int = 1
    inter_op_threads: int = 1
    graph_tag: str = "serve"
    signature_def: str = ""  # "": serving_default, else the first signature found (Triton's fallback)

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> TensorFlowSettings:
        intra = _int(config, "TF_NUM_INTRA_THREADS", 0, "non-negative")
        inter = _int(config, "TF_NUM_INTER_THREADS", -(1 << 31), "an integer")
        _int(config, "MAX_SESSION_SHARE_COUNT", 1, "positive")
        parameter_flag(config, "TF_USE_PER_SESSION_THREADS")
        ignored = [k for k in ("TF_USE_PER_SESSION_THREADS", "MAX_SESSION_SHARE_COUNT", "TF_INIT_OPS_FILE")
                   if parameter_text(config, k)]
        if ignored:
            log.info("model '%s': %s read and not used (TensorFlow 2 runs eagerly, without sessions)",
                     config.name, ", ".join(ignored))
        threads = default_threads(config)
        return cls(
            intra_op_threads=threads if intra is None else intra,
            inter_op_threads=max(1, threads - 1) if inter is None else max(inter, 0),
            graph_tag=parameter_text(config, "TF_GRAPH_TAG") or "serve",
            signature_def=parameter_text(config, "TF_SIGNATURE_DEF"),
        )
