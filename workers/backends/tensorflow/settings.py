"""Triton's TensorFlow backend parameters (its ``src/tensorflow.cc`` ParseParameters), read once at load:

* ``TF_NUM_INTRA_THREADS`` (non-negative), ``TF_NUM_INTER_THREADS`` (negative: each op on the
  calling thread, TensorFlow's meaning): the session's thread pools;
* ``TF_USE_PER_SESSION_THREADS``: the session gets an inter-op pool of its own;
* ``TF_GRAPH_TAG`` (default ``serve``) and ``TF_SIGNATURE_DEF`` (default ``serving_default``):
  which MetaGraph and signature of a SavedModel serve;
* ``TF_INIT_OPS_FILE``: a JSON file (``{"init_ops": ["init", ...]}``) in the version folder, else in the
  model's folder, naming the operations each session runs once after loading (a GraphDef's variable
  or table initialisers);
* ``MAX_SESSION_SHARE_COUNT`` (positive, default 1): how many instances of the model in one worker run on
  one session (one copy of the graph and weights; a session runs calls from several threads at once).

The intra-op pool is TensorFlow's CPU device's, made once per process: in a worker hosting several
TensorFlow models the first one loaded sizes it. Unset, it gets Conveyor's CPU default
(``workers/backends/cpu_threads.py``; TensorFlow's own is every core), and the inter-op setting is
-1: a call's ops run on the thread that calls, with no hand-off to a pool thread and back (Triton
leaves it to TensorFlow: a pool, a hand-off each way per call). A graph with parallel branches on a
host with cores to spare can ask for a pool with ``TF_NUM_INTER_THREADS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_flag, parameter_text
from conveyor.proto.errors import invalid_arg
from conveyor.workers.backends.cpu_threads import default_threads


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


# TensorFlow's inter-op setting for "run each op on the calling thread" (DirectSession's run_in_caller_thread).
CALLER_THREAD = -1


@dataclass(frozen=True, slots=True)
class TensorFlowSettings:
    intra_op_threads: int = 1
    inter_op_threads: int = CALLER_THREAD
    per_session_threads: bool = False
    init_ops_file: str = ""  # TF_INIT_OPS_FILE: the file's name, looked for by the backend
    session_share_count: int = 1  # MAX_SESSION_SHARE_COUNT
    graph_tag: str = "serve"
    signature_def: str = ""  # "": serving_default, else the first signature found (Triton's fallback)

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> TensorFlowSettings:
        intra = _int(config, "TF_NUM_INTRA_THREADS", 0, "non-negative")
        inter = _int(config, "TF_NUM_INTER_THREADS", -(1 << 31), "an integer")
        share = _int(config, "MAX_SESSION_SHARE_COUNT", 1, "positive")
        per_session = parameter_flag(config, "TF_USE_PER_SESSION_THREADS")
        return cls(
            intra_op_threads=default_threads(config) if intra is None else intra,
            inter_op_threads=CALLER_THREAD if inter is None else inter,
            per_session_threads=bool(per_session),
            init_ops_file=parameter_text(config, "TF_INIT_OPS_FILE"),
            session_share_count=share or 1,
            graph_tag=parameter_text(config, "TF_GRAPH_TAG") or "serve",
            signature_def=parameter_text(config, "TF_SIGNATURE_DEF"),
        )
