"""The checks a model's config must pass to load (``router/repository/scan.py`` runs them), each
in Triton's words where Triton has the check."""

from __future__ import annotations

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.batch_shapes import batch_shapes_problem
from conveyor.proto.migration import migration_problem
from conveyor.proto.sequence_config import sequence_problem
from conveyor.proto.triton_test_backends import NAMES as TRITON_TEST_BACKENDS
from conveyor.router.spec.adaptive import adaptive_problem
from conveyor.router.spec.engine_placement import placement_problem
from conveyor.router.spec.overload import overload_problem
from conveyor.router.spec.triton_rules import config_problem, instance_group_problem, io_problem

# The backends that answer through a response stream: Python models, vLLM, Triton's test backends.
_DECOUPLED = frozenset({"python", "vllm", *TRITON_TEST_BACKENDS})
# The backends whose outputs are the ones a config declares (a config without any serves nothing).
_DECLARED_OUTPUTS = frozenset({"onnxruntime", "pytorch", "tensorrt", "openvino", "tensorflow", "fil"})


def validate(config: mc.ModelConfig) -> str:
    """The first problem Triton would reject this config for, or ''."""
    problem = config_problem(config) or io_problem(config) or instance_group_problem(config)
    if problem:  # Triton's own checks, in its words
        return problem
    # Triton requires no outputs of any backend; the frameworks here serve only the outputs a config declares
    # (a Python model, or one of Triton's test backends, makes its own).
    if not config.output and config.backend in _DECLARED_OUTPUTS:
        return "model configuration must contain at least one output, none were specified"  # Triton's backends' words
    for kind, tensors in (("input", config.input), ("output", config.output)):
        names: set[str] = set()
        for t in tensors:
            if not t.name:
                return f"an {kind} has no name"
            if t.name in names:
                return f"{kind} '{t.name}' is declared twice"
            names.add(t.name)
            if t.data_type == mc.TYPE_INVALID:
                return f"{kind} '{t.name}' has no data_type"
            if any(d < -1 or d == 0 for d in t.dims) and not t.dims == [0]:
                return f"{kind} '{t.name}' has an invalid dimension in {list(t.dims)}"
    if config.HasField("dynamic_batching") and config.max_batch_size == 0:
        return "dynamic batching needs max_batch_size > 0"
    if config.model_transaction_policy.decoupled and config.backend not in _DECOUPLED:
        return ("decoupled models (model_transaction_policy { decoupled: true }) need the python or vllm backend "
                "(or one of Triton's test backends)")
    return (sequence_problem(config) or adaptive_problem(config)
            or batch_shapes_problem(config) or overload_problem(config) or placement_problem(config)
            or migration_problem(config))

