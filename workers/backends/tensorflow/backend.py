"""TensorFlow models as Triton's TensorFlow backend serves them: ``platform: "tensorflow_savedmodel"``
(``<version>/model.savedmodel/``, its ``serving_default`` signature) and ``platform:
"tensorflow_graphdef"`` (``<version>/model.graphdef``, a frozen GraphDef fed and fetched at the
config's tensor names), on TensorFlow 2's CPU runtime.

The config is checked against the signature at load with Triton's messages (``signature.py``).
A call hands the batch's arrays to TensorFlow (numeric arrays become tensors over the same memory
where TensorFlow can alias them; BYTES object arrays become string tensors) and reads the outputs
back as numpy arrays; strings come back as bytes objects, which the worker serialises.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import internal, unavailable
from conveyor.workers.backends.tensorflow.settings import TensorFlowSettings
from conveyor.workers.backends.tensorflow.signature import (
    check_config,
    import_tensorflow,
    load_graphdef,
    load_savedmodel,
)

tf = import_tensorflow()  # UNAVAILABLE, naming the extra, when TensorFlow is not installed

log = logging.getLogger(__name__)

_threads_lock = threading.Lock()
_threads: tuple[int, int] | None = None  # the process's pools, set by the first model loaded


def _set_threads(settings: TensorFlowSettings, model: str) -> None:
    """TensorFlow sizes its pools once per process, before its first op: the first model decides."""
    global _threads
    wanted = (settings.intra_op_threads, settings.inter_op_threads)
    with _threads_lock:
        if _threads is None:
            try:
                tf.config.threading.set_intra_op_parallelism_threads(wanted[0])
                tf.config.threading.set_inter_op_parallelism_threads(wanted[1])
                _threads = wanted
            except RuntimeError:  # TensorFlow already ran in this process (not through this backend)
                _threads = (tf.config.threading.get_intra_op_parallelism_threads(),
                            tf.config.threading.get_inter_op_parallelism_threads())
        if _threads != wanted:
            log.warning("model '%s' asks for %d intra-op / %d inter-op TensorFlow threads; this worker's "
                        "TensorFlow already runs %d / %d (set once per process)", model, *wanted, *_threads)


class TensorFlowBackend:
    # Short batches may run on the worker's main thread (workers/inline.py; a CPU instance only): a
    # signature is called from any thread, and the device scope is entered on each call.
    runs_on_any_thread = True

    def __init__(self, path: str, config: mc.ModelConfig, device: str) -> None:
        self.settings = settings = TensorFlowSettings.from_config(config)
        if device.startswith("cuda") and not tf.config.list_physical_devices("GPU"):
            raise unavailable(f"the config asks for a GPU instance ({device}) but TensorFlow {tf.__version__} "
                              f"sees no GPU (tensorflow-cpu, or no GPU)")
        # Only a GPU instance pins its ops (TensorFlow places on the CPU where it has no GPU anyway).
        self.device = f"/GPU:{device.split(':', 1)[1]}" if device.startswith("cuda:") else ""
        _set_threads(settings, config.name)
        for library in config.model_operations.op_library_filename:
            try:
                tf.load_op_library(library)
            except Exception as exc:
                raise unavailable(f"TensorFlow could not load op library '{library}': {exc}") from None
        if not os.path.exists(path):
            raise unavailable(f"unable to find '{path}' for model '{config.name}'")
        if config.platform == "tensorflow_graphdef":
            self.signature = load_graphdef(tf, path, config)
            self.positional = [i.name for i in config.input]  # a pruned graph takes its feeds in order
        else:
            self.signature = load_savedmodel(tf, path, settings.graph_tag, settings.signature_def, config.name)
            self.positional = []
        check_config(config, self.signature)
        self.output_order = [o.name for o in config.output]
        self.strings = {i.name for i in config.input if i.data_type == mc.TYPE_STRING}
        log.info("model '%s': TensorFlow %s %s from %s", config.name, tf.__version__, config.platform, path)

    def execute(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        try:
            if self.device:
                with tf.device(self.device):
                    return self._run(inputs, outputs)
            return self._run(inputs, outputs)
        except Exception as exc:
            raise internal(f"TensorFlow execution failed: {' '.join(str(exc).split())[:600]}") from None

    def _run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        feeds = {name: tf.constant(array, dtype=tf.string) if name in self.strings else tf.convert_to_tensor(array)
                 for name, array in inputs.items()}
        if self.positional:
            values = self.signature.function(*(feeds[name] for name in self.positional))
            result: dict[str, Any] = dict(zip(self.output_order, values, strict=True))
        else:
            result = self.signature.function(**feeds)
        return {name: result[name].numpy() for name in outputs}

    def close(self) -> None:
        del self.signature
