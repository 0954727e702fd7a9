"""Triton's ``--backend-config=[<backend>,]<setting>=<value>``: what each setting means here.

Settings that have a meaning in Conveyor act:

* ``default-max-batch-size`` (any backend, or global): the ``max_batch_size`` a
  completed config gets when the model can batch (Triton's default is 4; 0: no batching);
* ``onnxruntime,intra_op_thread_count`` / ``inter_op_thread_count``: the default of
  the model-config parameter of the same name, for models that do not set it.

Every other setting is accepted, as Triton's backends accept it, and logged once
with the reason it changes nothing here (``unused_settings``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.proto import model_config_pb2 as mc

TRITON_DEFAULT_MAX_BATCH_SIZE = 4
_ORT_PARAMETERS = ("intra_op_thread_count", "inter_op_thread_count")
# Backends as Triton names them on the command line, and the backend Conveyor runs for each.
_BACKEND = {"onnxruntime": "onnxruntime", "python": "python", "pytorch": "pytorch", "libtorch": "pytorch",
            "tensorrt": "tensorrt", "fil": "fil", "openvino": "openvino", "tensorflow": "tensorflow"}
_PYTHON_STUB = ("Python models run on threads of a worker process and share tensors through its "
                "shared-memory arena (--arena-size): there is no stub process or per-model shm region")
# Why a known setting changes nothing here.
_UNUSED = {
    ("python", "shm-default-byte-size"): _PYTHON_STUB,
    ("python", "shm-growth-byte-size"): _PYTHON_STUB,
    ("python", "shm-message-queue-size"): _PYTHON_STUB,
    ("python", "shm-region-prefix-name"): _PYTHON_STUB,
    ("python", "stub-timeout-seconds"): _PYTHON_STUB,
    ("python", "execution-environment"): "Python models run in the worker's own interpreter: install what they "
                                         "import into Conveyor's environment",
    ("onnxruntime", "enable-global-threadpool"): "each ONNX Runtime session has its own threads, sized per model "
                                                 "(intra_op_thread_count), inside one worker process",
    ("tensorrt", "coalesce-request-input"): "a batch's inputs are already contiguous in the worker's arena",
    ("tensorrt", "plugins"): "TensorRT plugins are loaded by the process that imports them: load them from the "
                             "worker's environment (LD_PRELOAD)",
    ("tensorrt", "version-compatible"): "engines are deserialized with the TensorRT Python API as they are",
}


def parse_setting(text: str) -> tuple[str, str, str]:
    """``[backend,]setting=value`` -> (backend or '', setting, value), with Triton's messages."""
    comma = text.find(",")
    if comma == 0:
        raise ValueError("No backend specified. --backend-config option format is "
                         f"<backend name>,<setting>=<value> or <setting>=<value>. Got {text}")
    backend = text[:comma] if comma > 0 else ""
    setting, eq, value = text[comma + 1:].partition("=")
    if not eq or not setting or not value:
        raise ValueError(f"--backend-config option format is '<backend name>,<setting>=<value>'. Got {text}")
    return backend, setting, value


@dataclass
class BackendConfig:
    settings: list[tuple[str, str, str]] = field(default_factory=list)

    @classmethod
    def parse(cls, items: list[str]) -> BackendConfig:
        return cls([parse_setting(item) for item in items])

    def _value(self, backend: str, setting: str) -> str | None:
        """A backend's own setting wins over the global one; the last given wins, as in Triton."""
        found: str | None = None
        for scope in ("", backend):
            for b, s, v in self.settings:
                if s == setting and (_BACKEND.get(b, b) == scope):
                    found = v
        return found

    def default_max_batch_size(self, backend: str) -> int:
        value = self._value(backend, "default-max-batch-size")
        try:
            return TRITON_DEFAULT_MAX_BATCH_SIZE if value is None else max(0, int(value))
        except ValueError:
            return TRITON_DEFAULT_MAX_BATCH_SIZE

    def apply(self, backend: str, config: mc.ModelConfig) -> None:
        """Fill the model-config parameters these settings are the server-wide default of."""
        if backend != "onnxruntime":
            return
        for name in _ORT_PARAMETERS:
            value = self._value("onnxruntime", name)
            if value is not None and name not in config.parameters:
                config.parameters[name].string_value = value

    def unused_settings(self) -> list[str]:
        """One line per setting that changes nothing here, with the reason."""
        out = []
        for backend, setting, value in self.settings:
            if setting == "default-max-batch-size":
                continue
            runs = _BACKEND.get(backend, backend)
            if runs == "onnxruntime" and setting in _ORT_PARAMETERS:
                continue
            reason = _UNUSED.get((runs, setting))
            if reason is None:
                reason = ("Conveyor has no backend by that name" if backend and backend not in _BACKEND
                          else "no Conveyor backend reads it")
            where = f"{backend}," if backend else ""
            out.append(f"--backend-config={where}{setting}={value}: accepted, not used by Conveyor because {reason}")
        return out
