"""Conveyor's ``triton_python_backend_utils``: what Triton Python models import
as ``pb_utils``.

The Python backend registers this package in ``sys.modules`` under that name
before it imports a ``model.py``, so ``import triton_python_backend_utils as
pb_utils`` works unchanged; no top-level package of that name is installed.
"""

from conveyor.workers.backends.python.pb_utils.errors import TritonError, TritonModelException
from conveyor.workers.backends.python.pb_utils.inference import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    get_input_tensor_by_name,
    get_output_tensor_by_name,
)
from conveyor.workers.backends.python.pb_utils.logger import Logger, LogLevel
from conveyor.workers.backends.python.pb_utils.metrics import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    Metric,
    MetricFamily,
    MetricKind,
)
from conveyor.workers.backends.python.pb_utils.model_config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from conveyor.workers.backends.python.pb_utils.model_control import is_model_ready, load_model, unload_model
from conveyor.workers.backends.python.pb_utils.options import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    InferenceTrace,
    MemoryType,
    PreferredMemory,
)
from conveyor.workers.backends.python.pb_utils.tensor import (
    TRITON_STRING_TO_NUMPY,
    Tensor,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)

__all__ = [
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "LogLevel",
    "Logger",
    "MemoryType",
    "Metric",
    "MetricFamily",
    "MetricKind",
    "ModelConfig",
    "PreferredMemory",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]
