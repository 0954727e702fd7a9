"""TensorFlow models as Triton's TensorFlow backend serves them: ``platform: "tensorflow_savedmodel"``
(``<version>/model.savedmodel/``, its ``serving_default`` signature) and ``platform:
"tensorflow_graphdef"`` (``<version>/model.graphdef``, a frozen GraphDef fed and fetched at the
config's tensor names), on TensorFlow 2's CPU runtime.

The config is checked against the signature at load with Triton's messages (``signature.py``).
Each instance runs its model in a TensorFlow session (``signature.py``; its own, or shared by up to
``MAX_SESSION_SHARE_COUNT`` instances in this worker); a call hands the batch's numpy arrays to one
session run (BYTES object arrays become string tensors) and gets numpy arrays back; strings come
back as bytes objects, which the worker serialises.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import internal, unavailable
from conveyor.proto.repository_files import check_tree, unreadable
from conveyor.workers.backends.tensorflow.settings import TensorFlowSettings
from conveyor.workers.backends.tensorflow.signature import (
    Signature,
    check_config,
    import_tensorflow,
    load_graphdef,
    load_savedmodel,
    run_init_ops,
)

tf = import_tensorflow()  # UNAVAILABLE, naming the extra, when TensorFlow is not installed

log = logging.getLogger(__name__)

_threads_lock = threading.Lock()
_intra_threads: int | None = None  # the process's intra-op pool, sized by the first model loaded


def _set_intra_threads(settings: TensorFlowSettings, model: str) -> None:
    """The intra-op pool is TensorFlow's CPU device's, made once per process: the first model decides
    (inter-op settings are each session's own)."""
    global _intra_threads
    wanted = settings.intra_op_threads
    with _threads_lock:
        if _intra_threads is None:
            try:
                tf.config.threading.set_intra_op_parallelism_threads(wanted)
                _intra_threads = wanted
            except RuntimeError:  # TensorFlow already ran in this process (not through this backend)
                _intra_threads = tf.config.threading.get_intra_op_parallelism_threads()
        if _intra_threads != wanted:
            log.warning("model '%s' asks for %d intra-op TensorFlow threads; this worker's TensorFlow already "
                        "runs %d (set once per process)", model, wanted, _intra_threads)


def session_config(settings: TensorFlowSettings, gpu: bool) -> Any:
    """The ConfigProto of an instance's session: the model's threads; a CPU instance sees no GPU (it
    takes no GPU memory on a GPU host), a GPU one takes GPU memory as it needs it."""
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=settings.intra_op_threads,
                                      inter_op_parallelism_threads=settings.inter_op_threads,
                                      use_per_session_threads=settings.per_session_threads,
                                      allow_soft_placement=True)
    if gpu:
        config.gpu_options.allow_growth = True
    else:
        config.device_count["GPU"] = 0
    return config


@dataclass(slots=True)
class _Shared:
    signature: Signature  # the loaded model and its session
    users: int  # the instances running on it


# Sessions shared by instances of one model in this worker (Triton's MAX_SESSION_SHARE_COUNT), by the
# model's path, device and config.
_sessions_lock = threading.Lock()
_sessions: dict[tuple[str, str, bytes], list[_Shared]] = {}


def _take_session(key: tuple[str, str, bytes], share: int, load: Callable[[], Signature]) -> Signature:
    """A loaded model for one more instance: a session of the key's with fewer than ``share`` users, or a
    new one (loaded outside the lock: another model's load does not wait for it)."""
    with _sessions_lock:
        for shared in _sessions.get(key, ()):
            if shared.users < share:
                shared.users += 1
                return shared.signature
    signature = load()
    with _sessions_lock:
        _sessions.setdefault(key, []).append(_Shared(signature, 1))
    return signature


def _give_back_session(key: tuple[str, str, bytes], signature: Signature) -> None:
    """An instance is done with ``signature``'s session: closed once no instance uses it."""
    with _sessions_lock:
        entries = _sessions.get(key, [])
        for shared in entries:
            if shared.signature is signature:
                shared.users -= 1
                if shared.users == 0:
                    entries.remove(shared)
                    if not entries:
                        del _sessions[key]
                    signature.session.close()
                return


class TensorFlowBackend:
    # Short batches may run on the worker's main thread (workers/inline.py; a CPU instance only): a
    # session runs from any thread.
    runs_on_any_thread = True

    def __init__(self, path: str, config: mc.ModelConfig, device: str) -> None:
        self.settings = settings = TensorFlowSettings.from_config(config)
        gpu = device.startswith("cuda")
        if gpu and not tf.config.list_physical_devices("GPU"):
            raise unavailable(f"the config asks for a GPU instance ({device}) but TensorFlow {tf.__version__} "
                              f"sees no GPU (tensorflow-cpu, or no GPU)")
        # Only a GPU instance pins its ops (TensorFlow places on the CPU where it has no GPU anyway).
        pinned = f"/GPU:{device.split(':', 1)[1]}" if device.startswith("cuda:") else ""
        _set_intra_threads(settings, config.name)
        for library in config.model_operations.op_library_filename:
            try:
                tf.load_op_library(library)
            except Exception as exc:
                raise unavailable(f"TensorFlow could not load op library '{library}': {exc}") from None
        try:  # TensorFlow opens it by name again: a name swapped after this check is not seen
            check_tree(path)  # a SavedModel's folder and its files, or a GraphDef (read below)
        except FileNotFoundError:
            raise unavailable(f"unable to find '{path}' for model '{config.name}'") from None
        except OSError as exc:  # a FIFO would hold the instance's thread for ever (proto/repository_files.py)
            raise unavailable(unreadable(path, exc)) from None
        self._key = (path, device, config.SerializeToString(deterministic=True))
        self.signature = sig = _take_session(self._key, settings.session_share_count,
                                             lambda: _load(path, config, settings, gpu, pinned))
        self.feed_names = list(sig.inputs)
        self.fetch_index = {name: i for i, name in enumerate(sig.outputs)}
        # One C++ call per batch: numpy arrays in (BYTES as object arrays of bytes), numpy arrays out.
        self._call = sig.session.make_callable(sig.fetches, feed_list=sig.feeds)
        log.info("model '%s': TensorFlow %s %s from %s", config.name, tf.__version__, config.platform, path)

    def execute(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        try:
            values = self._call(*(inputs[name] for name in self.feed_names))
        except Exception as exc:
            raise internal(f"TensorFlow execution failed: {' '.join(str(exc).split())[:600]}") from None
        return {name: values[self.fetch_index[name]] for name in outputs}

    def close(self) -> None:
        del self._call
        _give_back_session(self._key, self.signature)
        del self.signature


def _load(path: str, config: mc.ModelConfig, settings: TensorFlowSettings, gpu: bool, pinned: str) -> Signature:
    """The model in a session of its own, checked against the config, its init ops run."""
    proto = session_config(settings, gpu)
    if config.platform == "tensorflow_graphdef":
        signature = load_graphdef(tf, path, config, session_config=proto, device=pinned)
    else:
        signature = load_savedmodel(tf, path, settings.graph_tag, settings.signature_def, config.name,
                                    config=proto, device=pinned)
    try:
        check_config(config, signature)
        if settings.init_ops_file:
            run_init_ops(tf, signature, path, settings.init_ops_file, config.name)
    except Exception:
        signature.session.close()
        raise
    return signature
