"""Triton's own checks of a model config, in its order and words (core's model_config_utils.cc:
ValidateModelConfig, ValidateModelIOConfig, the sequence controls' Get*SequenceControlProperties, and
ValidateInstanceGroup's CPU-host rules). ``router/spec/validate.py`` runs them before Conveyor's own checks,
so that a config Triton refuses is refused with Triton's message (its QA greps the server log for it)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from conveyor.proto import model_config_pb2 as mc
from conveyor.router.spec.queue_policy import scheduling_problem

# Triton's -1: a variable-size dimension (triton::common::WILDCARD_DIM).
WILDCARD_DIM = -1
_CONTROL = mc.ModelSequenceBatching.Control
_BOOLEAN_CONTROLS = (_CONTROL.CONTROL_SEQUENCE_START, _CONTROL.CONTROL_SEQUENCE_END, _CONTROL.CONTROL_SEQUENCE_READY)
_CORRID_TYPES = (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING)
_ONE_SOURCE_BATCH_INPUTS = frozenset({
    mc.BatchInput.BATCH_ELEMENT_COUNT, mc.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT,
    mc.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, mc.BatchInput.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE,
    mc.BatchInput.BATCH_ITEM_SHAPE, mc.BatchInput.BATCH_ITEM_SHAPE_FLATTEN})
_TENSORRT_PLAN = "tensorrt_plan"
_CONDITION_PREFIX = ("conveyor.step.", "conveyor.exit_when")
_ENSEMBLE = "ensemble"


# Triton's default count of a KIND_CPU group that gives none, for the backends that opt in (SetDefaultInstanceCount:
# their sessions run well side by side); 1 for every other group.
_CPU_COUNT_BACKENDS = frozenset({"onnxruntime", "tensorflow"})
DEFAULT_CPU_COUNT = 2


def default_count(kind: int, backend: str) -> int:
    """The instances a group without ``count`` has (core's SetDefaultInstanceCount)."""
    if kind == mc.ModelInstanceGroup.KIND_CPU and backend in _CPU_COUNT_BACKENDS:
        return DEFAULT_CPU_COUNT
    return 1


def config_problem(config: mc.ModelConfig) -> str:
    """ValidateModelConfig's first refusal (less its platform/backend pairing, which the repository scan
    decides), or ''."""
    name = config.name
    if config.platform == _ENSEMBLE and config.backend:
        return (f"Ensemble model '{name}' must have platform type '{config.platform}' and empty backend type")
    if config.max_batch_size < 0:
        return f"'max_batch_size' must be non-negative value for {name}"
    problem = scheduling_problem(config)  # dynamic_batching's checks
    if problem:
        return problem
    if config.HasField("sequence_batching"):
        problem = _sequence_batching_problem(config)
        if problem:
            return problem
    if config.HasField("ensemble_scheduling"):
        if config.platform != _ENSEMBLE:
            return f"ensemble scheduling cannot be set for model '{name}' whose platform is not {_ENSEMBLE}"
        if config.instance_group:
            return f"instance group should not be specified for ensemble '{name}'"
        if config.HasField("optimization"):
            return f"optimization should not be specified for ensemble '{name}'"
        if config.model_warmup:
            return f"model_warmup can not be specified for ensemble '{name}'"
        if not config.ensemble_scheduling.step:
            return f"must specify 'step' for ensemble '{name}'"
        problem = "" if conditional(config) else _ensemble_graph_problem(config)
        if problem:
            return problem
    elif config.platform == _ENSEMBLE:
        return f"ensemble scheduling must be set for ensemble {name} whose platform is {_ENSEMBLE}"
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        return (f"Response Cache does not currently support model {name} with 'decoupled' transaction policy. "
                "Please disable the response cache.")
    return _metrics_problem(config.model_metrics) if config.HasField("model_metrics") else ""


def _metrics_problem(metrics: mc.ModelMetrics) -> str:
    """ValidateModelMetrics."""
    for control in metrics.metric_control:
        if not control.HasField("metric_identifier"):
            return "metric control must specify 'metric_identifier'"
        if not control.metric_identifier.family:
            return "metric identifier must specify non-empty 'family'"
        if not control.HasField("histogram_options"):
            return "metric control must specify 'histogram_options'"
        if not control.histogram_options.buckets:
            return "histogram options must specify non-empty 'buckets'"
    return ""


def io_problem(config: mc.ModelConfig) -> str:
    """ValidateModelIOConfig's first refusal (each input, each output, the batch inputs and outputs, each
    with " for <model>"), or ''."""
    both: tuple[tuple[str, Iterable[mc.ModelInput | mc.ModelOutput]], ...] = (
        ("model input ", config.input), ("model output ", config.output))
    for prefix, tensors in both:
        for io in tensors:
            problem = _io_shape_problem(io, config.max_batch_size, prefix)
            if not problem and isinstance(io, mc.ModelInput) and io.format in (
                    mc.ModelInput.FORMAT_NHWC, mc.ModelInput.FORMAT_NCHW) and len(io.dims) != 3:
                problem = "model input NHWC/NCHW require 3 dims"
            if not problem and io.is_shape_tensor and config.platform != _TENSORRT_PLAN:
                problem = "shape tensors are only supported for TensorRT platform"
            if problem:
                return f"{problem} for {config.name}"
    problem = _batch_io_problem(config)
    return f"{problem} for {config.name}" if problem else ""


def instance_group_problem(config: mc.ModelConfig) -> str:
    """ValidateInstanceGroup's first refusal that holds on any host (the group named as Triton's normalization
    names it: ``<model>_<index>``), or ''. A GPU that no worker has is the pool's to say (router/pool.py)."""
    if config.HasField("ensemble_scheduling"):
        return ""
    for index, group in enumerate(config.instance_group):
        label = f"instance group {group.name or f'{config.name}_{index}'} of model {config.name}"
        if group.kind == mc.ModelInstanceGroup.KIND_MODEL and group.gpus:
            return f"{label} has kind KIND_MODEL but specifies one or more GPUs"
        if group.kind == mc.ModelInstanceGroup.KIND_CPU and group.gpus:
            return f"{label} has kind KIND_CPU but specifies one or more GPUs"
        negative = [g for g in group.gpus if g < 0]
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and negative:  # no host has it
            return (f"{label} specifies invalid or unsupported gpu id {negative[0]}. GPUs with at least the minimum "
                    "required CUDA compute compatibility have ids from 0")
    return ""


@dataclass(eq=False)
class _Tensor:
    """An ensemble tensor in Triton's data-flow graph (model_config_utils.cc EnsembleTensor)."""

    name: str
    is_output: bool
    ready: bool = False
    prev: list[_Tensor] = field(default_factory=list)
    next: list[_Tensor] = field(default_factory=list)


def _ensemble_graph_problem(config: mc.ModelConfig) -> str:
    """BuildEnsembleGraph and ValidateEnsembleSchedulingConfig's data-flow checks (steps counted from 0, as
    Triton counts them; tensors visited in the order the steps name them)."""
    name = config.name
    tensors: dict[str, _Tensor] = {}
    for index, step in enumerate(config.ensemble_scheduling.step):
        for field_name, given in (("model_name", step.model_name), ("input_map", step.input_map),
                                  ("output_map", step.output_map)):
            if not given:
                return f"must specify '{field_name}' in step {index} of ensemble '{name}'"
        written: list[_Tensor] = []
        for tensor_name in step.output_map.values():
            node = tensors.get(tensor_name)
            if node is None:
                node = tensors[tensor_name] = _Tensor(tensor_name, True)
            elif node.is_output:
                return (f"ensemble tensor '{tensor_name}' can appear in an output map only once for ensemble "
                        f"'{name}' step {index}")
            else:
                node.is_output = True
            written.append(node)
        for tensor_name in step.input_map.values():  # a map: each model input once
            node = tensors.setdefault(tensor_name, _Tensor(tensor_name, False))
            for out in written:
                out.prev.append(node)
                node.next.append(out)
    queue: list[_Tensor] = []
    for io in config.input:
        node = tensors.get(io.name)
        if node is None:
            return f"ensemble input '{io.name}' for ensemble {name}' is not used"
        node.ready = True
        queue.append(node)
    while queue:
        for after in queue.pop(0).next:
            if not after.ready and all(before.ready for before in after.prev):
                after.ready = True
                queue.append(after)
    outputs: set[str] = set()
    for output in config.output:
        node = tensors.get(output.name)
        if node is None:
            return f"ensemble output '{output.name}' for ensemble {name}' is not used"
        if not node.ready:
            return _not_written(node, name)
        outputs.add(output.name)
    for tensor_name, node in tensors.items():
        if tensor_name not in outputs and (not node.ready or not node.next):
            return f"ensemble tensor '{tensor_name}' is unused in ensemble '{name}'"
    return ""


def _not_written(node: _Tensor, ensemble: str) -> str:
    """Triton's message for an ensemble output no step can write: with the first tensor upstream of it that is
    not connected, when there is one."""
    message = f"output '{node.name}' for ensemble '{ensemble}' is not written"
    last, prev, seen = node, node.prev, set()
    while prev:
        nodes, prev = prev, []
        for before in nodes:
            if not before.ready and before.name not in seen:
                seen.add(before.name)
                last, prev = before, before.prev
                break
    if last is not node:
        message += f": at least one of its depending tensors, '{last.name}', is not connected"
    return message


def _sequence_batching_problem(config: mc.ModelConfig) -> str:
    sb, name = config.sequence_batching, config.name
    if config.response_cache.enable:
        return (f"Response Cache does not currently support model {name} with sequence batching scheduler. "
                "Please disable the response cache.")
    for kind in _BOOLEAN_CONTROLS:
        problem = _control_problem(sb, name, kind, boolean=True)
        if problem:
            return problem
    problem = _control_problem(sb, name, _CONTROL.CONTROL_SEQUENCE_CORRID, boolean=False)
    if problem:
        return problem
    if sb.HasField("oldest"):
        for size in sb.oldest.preferred_batch_size:
            if size <= 0:
                return f"sequence batching preferred batch size must be positive for {name}"
            if size > config.max_batch_size:
                return f"sequence batching preferred batch size must be <= max batch size for {name}"
    if sb.HasField("direct") and not 0.0 <= sb.direct.minimum_slot_utilization <= 1.0:
        return f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}"
    return ""


def _control_problem(sb: mc.ModelSequenceBatching, name: str, kind: int, boolean: bool) -> str:
    """Get{Boolean,Typed}SequenceControlProperties' refusals for one control kind."""
    kind_name = _CONTROL.Kind.Name(kind)
    seen_tensors: set[str] = set()
    seen_control = False
    for ci in sb.control_input:
        if not ci.name:
            return f"sequence batching control tensor must have a name for {name}"
        if ci.name in seen_tensors:
            return f"sequence batching control tensor '{ci.name}' is specified for multiple control kinds for {name}"
        seen_tensors.add(ci.name)
        for c in ci.control:
            if c.kind != kind:
                continue
            if seen_control:
                return f"sequence batching specifies multiple {kind_name} tensors for {name}"
            seen_control = True
            given = [len(v) for v in (c.int32_false_true, c.fp32_false_true, c.bool_false_true) if len(v)]
            if boolean:
                if not given:
                    return ("sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                            f"'bool_false_true' for {kind_name} for {name}")
                if len(given) > 1:
                    return ("sequence batching specifies more than one from 'int32_false_true', "
                            f"'fp32_false_true' and 'bool_false_true' for {kind_name} for {name}")
                field = ("int32_false_true" if len(c.int32_false_true) else "fp32_false_true"
                         if len(c.fp32_false_true) else "bool_false_true")
                if given[0] != 2:
                    return (f"sequence batching control '{field}' must have exactly 2 entries for {kind_name} "
                            f"for {name}")
            else:
                if given:
                    return ("sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                            f"'bool_false_true' for {kind_name} for {name}")
                if c.data_type not in _CORRID_TYPES:
                    return (f"unexpected data type for control {kind_name} for {name}. Allowed data types are "
                            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING")
    return ""


def _io_shape_problem(io: mc.ModelInput | mc.ModelOutput, max_batch_size: int, prefix: str) -> str:
    """ValidateIOShape."""
    if not io.name:
        return f"{prefix}must specify 'name'"
    named = f"{prefix}'{io.name}' "
    if io.data_type == mc.TYPE_INVALID:
        return f"{named}must specify 'data_type'"
    if not io.dims:
        return f"{named}must specify 'dims'"
    has_reshape = io.HasField("reshape")
    if has_reshape and not io.reshape.shape and max_batch_size == 0:
        return f"{named}cannot have empty reshape for non-batching model as scalar tensors are not supported"
    if _bad_dims(io.dims):
        return f"{named}dimension must be integer >= 1, or -1 to indicate a variable-size dimension"
    if not has_reshape:
        return ""
    if _bad_dims(io.reshape.shape):
        return f"{named}reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension"
    dims_size, reshape_size = _element_count(io.dims), _element_count(io.reshape.shape)
    if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
        return f"{named}has different size for dims and reshape"
    if dims_size == WILDCARD_DIM:
        dims_runs, reshape_runs = _runs(io.dims), _runs(io.reshape.shape)
        if len(dims_runs) != len(reshape_runs):
            return f"{named}has different number of variable-size dimensions for dims and reshape"
        if dims_runs != reshape_runs:
            return f"{named}has different size for dims and reshape"
    return ""


def _bad_dims(dims: Iterable[int]) -> bool:
    return any(d < 1 and d != WILDCARD_DIM for d in dims)


def _element_count(dims: Iterable[int]) -> int:
    """GetElementCount: -1 when any dimension is variable, 0 for no dimensions."""
    count, any_dim = 1, False
    for d in dims:
        any_dim = True
        if d == WILDCARD_DIM:
            return WILDCARD_DIM
        count *= d
    return count if any_dim else 0


def _runs(dims: Iterable[int]) -> list[int]:
    """The element counts of the runs between variable-size dimensions."""
    out, current = [], 1
    for d in dims:
        if d == WILDCARD_DIM:
            out.append(current)
            current = 1
        else:
            current *= d
    return [*out, current]


def _batch_io_problem(config: mc.ModelConfig) -> str:
    """ValidateBatchIO."""
    inputs = {io.name for io in config.input}
    outputs = {io.name for io in config.output}
    for bi in config.batch_input:
        kind = mc.BatchInput.Kind.Name(bi.kind)
        if bi.kind not in _ONE_SOURCE_BATCH_INPUTS:
            return f"unknown batch input kind '{kind}'"
        if len(bi.source_input) != 1:
            return f"batch input kind '{kind}' expects 1 source input, got {len(bi.source_input)}"
        if bi.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
            return "batch input data type must be TYPE_INT32 or TYPE_FP32"
        for source in bi.source_input:
            if source not in inputs:
                return f"unknown source input name '{source}'"
    for bo in config.batch_output:
        kind = mc.BatchOutput.Kind.Name(bo.kind)
        if bo.kind != mc.BatchOutput.BATCH_SCATTER_WITH_INPUT_SHAPE:
            return f"unknown batch output kind '{kind}'"
        if len(bo.source_input) != 1:
            return f"batch output kind '{kind}' expects 1 source input, got {len(bo.source_input)}"
        for source in bo.source_input:
            if source not in inputs:
                return f"unknown source input name '{source}'"
        targets: set[str] = set()
        for target in bo.target_name:
            if target not in outputs:
                return f"unknown target output name '{target}'"
            if target in targets:
                return f"target output name '{target}' can only be specified once"
            targets.add(target)
    return ""


@dataclass(eq=False)
class _Node:
    """An ensemble tensor as Triton's ValidateEnsembleConfig infers it (ensemble_utils.cc TensorNode)."""

    model: str
    data_type: int = 0
    dims: tuple[int, ...] = ()
    full_dims: tuple[int, ...] = ()
    decoupled: bool = False
    label: int = 0
    visited: bool = False
    prev: list[_Node] = field(default_factory=list)
    next: list[_Node] = field(default_factory=list)
    sibling: _Node | None = None


def _node(model: str, batching: bool, data_type: int, dims: Iterable[int]) -> _Node:
    shape = tuple(dims)
    return _Node(model, data_type, shape, ((WILDCARD_DIM,) if batching else ()) + shape)


def _same_dims(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or WILDCARD_DIM in (x, y) for x, y in zip(a, b, strict=True))


def _dims_text(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _consistency(lhs: _Node, rhs: _Node, prefix: str) -> str:
    if lhs.data_type != rhs.data_type:
        return (f"{prefix}inconsistent data type: {mc.DataType.Name(lhs.data_type)} is inferred from model "
                f"{lhs.model} while {mc.DataType.Name(rhs.data_type)} is inferred from model {rhs.model}")
    if not _same_dims(lhs.dims, rhs.dims) and not _same_dims(lhs.full_dims, rhs.full_dims):
        return (f"{prefix}inconsistent shape: {_dims_text(lhs.full_dims)} is inferred from model {lhs.model} while "
                f"{_dims_text(rhs.full_dims)} is inferred from model {rhs.model}")
    return ""


def ensemble_models_problem(name: str, config: mc.ModelConfig, step_configs: list[mc.ModelConfig]) -> str:
    """ValidateEnsembleConfig: each step against its composing model's (completed) config, in Triton's words: the
    batch size, the tensor mapping, each ensemble tensor's type and shape. Its rule for decoupled steps' branches
    is ``ensemble_branches_problem``'s (Conveyor runs more of them than Triton: router/ensembles/levels.py)."""
    return _ensemble_tensors(name, config, step_configs)[0]


def ensemble_branches_problem(name: str, config: mc.ModelConfig, step_configs: list[mc.ModelConfig]) -> str:
    """Triton's refusal of a step that takes inputs that came through different decoupled steps, or ''."""
    problem, tensors = _ensemble_tensors(name, config, step_configs)
    return "" if problem or conditional(config) else _branches_problem(name, config, tensors)


def _ensemble_tensors(name: str, config: mc.ModelConfig,
                      step_configs: list[mc.ModelConfig]) -> tuple[str, dict[str, _Node]]:
    batching = config.max_batch_size > 0
    tensors: dict[str, _Node] = {}
    for io in config.input:
        tensors[io.name] = _node(name, batching, io.data_type, io.reshape.shape if io.HasField("reshape") else io.dims)
    sink = _Node(name)
    for output in config.output:
        shape = output.reshape.shape if output.HasField("reshape") else output.dims
        out = tensors.setdefault(output.name, _node(name, batching, output.data_type, shape))
        sink.prev.append(out)
        out.next.append(sink)
    for step, step_config in zip(config.ensemble_scheduling.step, step_configs, strict=True):
        model = step.model_name
        if step_config.max_batch_size != 0 and step_config.max_batch_size < config.max_batch_size:
            return (f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it contains model "
                    f"{model} which only allows maximum batch size to be {step_config.max_batch_size}"), tensors
        problem = _mapping_problem(name, step, step_config, tensors)
        if problem:
            return problem, tensors
    return "", tensors


def conditional(config: mc.ModelConfig) -> bool:
    """An ensemble with Conveyor's conditional steps (``conveyor.step.N.when``, ``conveyor.exit_when``): a tensor
    may feed only a condition and an output may be written by one branch of several, which Triton's data-flow
    checks would refuse; Conveyor's own plan checks them (router/spec/ensemble_plan.py)."""
    return any(key.startswith(_CONDITION_PREFIX) for key in config.parameters)


def _mapping_problem(name: str, step: mc.ModelEnsembling.Step, config: mc.ModelConfig,
                     tensors: dict[str, _Node]) -> str:
    """ValidateTensorMapping."""
    model, batching = step.model_name, config.max_batch_size > 0
    inputs = {io.name for io in config.input}
    for key, tensor in step.input_map.items():
        if key not in inputs:
            return (f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input {key} in model "
                    f"{model}")
    for io in config.input:
        mapped = step.input_map.get(io.name)
        if mapped is None:
            if io.optional:
                continue
            return f"in ensemble {name}, input {io.name} in model {model} is not mapped to any ensemble tensors"
        node = _node(model, batching, io.data_type, io.dims)
        if mapped in tensors:
            problem = _consistency(tensors[mapped], node, f"in ensemble {name}, ensemble tensor {mapped}: ")
            if problem:
                return problem
        else:
            tensors[mapped] = node
    outputs = {io.name: io for io in config.output}
    for key, tensor in step.output_map.items():
        if key not in outputs:
            return (f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output {key} in model "
                    f"{model}")
    sibling = _Node(model)
    for key, tensor in step.output_map.items():
        declared = outputs[key]
        node = _node(model, batching, declared.data_type, declared.dims)
        if tensor in tensors:
            problem = _consistency(tensors[tensor], node, f"in ensemble {name}, ensemble tensor {tensor}: ")
            if problem:
                return problem
        else:
            tensors[tensor] = node
        tensors[tensor].sibling = sibling
    for tensor in step.output_map.values():
        node = tensors[tensor]
        node.decoupled = config.model_transaction_policy.decoupled
        for source in step.input_map.values():
            node.prev.append(tensors[source])
            tensors[source].next.append(node)
    return ""


def _branches_problem(name: str, config: mc.ModelConfig, tensors: dict[str, _Node]) -> str:
    """ValidateEnsembleConfig's walk: a step may not take inputs that came through different decoupled steps."""
    labels = 0
    queue = []
    for io in config.input:
        tensors[io.name].visited = True
        queue.append(tensors[io.name])
    while queue:
        for after in queue.pop(0).next:
            if after.visited or not all(before.visited for before in after.prev):
                continue
            label = after.prev[0].label
            if any(before.label != label for before in after.prev):
                return (f"in ensemble {name}, step of model '{after.model}' receives inputs originated from "
                        "different decoupled models")
            if after.sibling is not None and after.sibling.visited:
                after.label = after.sibling.label
            else:
                if after.decoupled:
                    labels += 1
                after.label = labels if after.decoupled else label
                if after.sibling is not None:
                    after.sibling.label, after.sibling.visited = after.label, True
            after.visited = True
            queue.append(after)
    return ""
