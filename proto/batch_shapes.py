"""Batching requests whose shapes differ, read once from a model's config for
the router (which requests may share a batch) and the worker (how the batch's
tensors are built and its outputs split back).

Triton's ragged batching (``allow_ragged_batch`` on an input, ``batch_input``,
``batch_output``), checked at load as Triton checks it:

* a ragged input batches whatever its shape; an array backend gets it as one
  1-D tensor, the requests' elements one after another;
* each ``batch_input`` is a tensor the server computes per batch from the
  shapes of its ``source_input`` (exactly one), ``data_type`` TYPE_INT32 or
  TYPE_FP32, fed to the model under each ``target_name``;
* a ``batch_output`` of kind BATCH_SCATTER_WITH_INPUT_SHAPE hands each request
  the next elements of the model's output, shaped like the output's dims with
  each -1 taken from the request's ``source_input`` at the same index.

Conveyor's pad-to-bucket batching (an opt-in extension; Triton ignores
parameters it does not know, so such a config still loads there):

    parameters { key: "conveyor.pad_batching" value { string_value: "max" } }       # or "16,32,64,128"

* every input with a variable (-1) dimension that is not ragged is *padded*:
  requests batch whatever their lengths there, each variable dimension is
  padded to the batch's largest length ("max") or to the smallest bucket that
  holds it; a request longer than the largest bucket is refused;
* ``conveyor.pad_value`` (default 0) fills the padding, ``conveyor.pad_value.<input>``
  for one input;
* the model learns each request's own lengths from a ``batch_input`` (e.g.
  BATCH_ITEM_SHAPE), computed from the shapes the clients sent;
* an output whose dims are -1 at every variable position of a padded input
  *follows* that input (the first such input in config order); each request's
  output is cut back to its own length along those dims, where the model kept
  the padded length. ``conveyor.pad_output.<output>`` names the input an output
  follows, or "" for none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.datatypes import config_to_datatype

PAD_BATCHING = "conveyor.pad_batching"
PAD_VALUE = "conveyor.pad_value"
PAD_OUTPUT = "conveyor.pad_output"

_INPUT_KIND = mc.BatchInput.Kind
_BATCH_INPUT_TYPES = (mc.TYPE_INT32, mc.TYPE_FP32)


@dataclass(frozen=True, slots=True)
class BatchInputSpec:
    """One ``batch_input``: what to compute, from which input, under which names."""

    kind: int  # mc.BatchInput.Kind
    targets: tuple[str, ...]
    datatype: str  # INT32 or FP32
    source: str


@dataclass(frozen=True, slots=True)
class ScatterSpec:
    """A ``batch_output`` BATCH_SCATTER_WITH_INPUT_SHAPE target: a request's part is
    ``shape`` with each -1 replaced by ``source``'s dimension at that index."""

    source: str
    shape: tuple[int, ...]  # with the batch dimension (-1) for a batching model


@dataclass(frozen=True, slots=True)
class PadSpec:
    """A padded input: its variable dims (indexes without the batch dim) and the fill."""

    positions: tuple[int, ...]
    value: float | int | bool | bytes


@dataclass(frozen=True, slots=True)
class BatchShapes:
    ragged: frozenset[str] = frozenset()
    batch_inputs: tuple[BatchInputSpec, ...] = ()
    scatter: dict[str, ScatterSpec] = field(default_factory=dict)  # output name -> spec
    padded: dict[str, PadSpec] = field(default_factory=dict)  # input name -> spec
    buckets: tuple[int, ...] = ()  # ascending; () pads to the batch's max
    follows: dict[str, str] = field(default_factory=dict)  # output -> the padded input it is cut back by

    @property
    def active(self) -> bool:
        """Anything beyond concatenating equal shapes."""
        return bool(self.ragged or self.batch_inputs or self.scatter or self.padded)

    def bucket(self, length: int) -> int:
        """The padded size of a dimension whose longest request has ``length`` (-1: beyond every bucket)."""
        if not self.buckets:
            return length
        for b in self.buckets:
            if b >= length:
                return b
        return -1

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> BatchShapes:
        """Raises ValueError with the reason a config cannot load."""
        inputs = {i.name: i for i in config.input}
        outputs = {o.name: o for o in config.output}
        ragged = frozenset(i.name for i in config.input if i.allow_ragged_batch)
        batch_inputs = _batch_inputs(config, inputs)
        scatter = _scatter(config, inputs, outputs)
        buckets, padded = _pad_policy(config, ragged)
        follows = _follows(config, padded, outputs, scatter) if padded else {}
        return cls(ragged, batch_inputs, scatter, padded, buckets, follows)


def batch_shapes_problem(config: mc.ModelConfig) -> str:
    """Why Conveyor cannot load this config's ragged/pad batching settings, or ''."""
    try:
        shapes = BatchShapes.from_config(config)
    except ValueError as exc:
        return str(exc)
    if config.backend == "python" and (shapes.batch_inputs or shapes.scatter):
        return ("batch_input and batch_output are not supported by the python backend: a Python model gets "
                "each request's own tensors, with their own shapes")
    return ""


def _batch_inputs(config: mc.ModelConfig, inputs: dict[str, mc.ModelInput]) -> tuple[BatchInputSpec, ...]:
    specs: list[BatchInputSpec] = []
    seen: set[str] = set()
    for bi in config.batch_input:
        kind = _INPUT_KIND.Name(bi.kind)
        if len(bi.source_input) != 1:
            raise ValueError(f"batch input kind '{kind}' expects 1 source input, got {len(bi.source_input)}")
        if bi.data_type not in _BATCH_INPUT_TYPES:
            raise ValueError("batch input data type must be TYPE_INT32 or TYPE_FP32")
        source = bi.source_input[0]
        if source not in inputs:
            raise ValueError(f"unknown source input name '{source}'")
        if not bi.target_name:
            raise ValueError(f"batch input kind '{kind}' has no target_name: the model would never see it")
        for target in bi.target_name:
            if target in inputs:
                raise ValueError(
                    f"batch input target '{target}' is also a declared input: the server computes a batch "
                    "input, clients cannot send it"
                )
            if target in seen:
                raise ValueError(f"batch input target '{target}' is given more than once")
            seen.add(target)
        specs.append(BatchInputSpec(bi.kind, tuple(bi.target_name), _datatype(bi.data_type), source))
    return tuple(specs)


def _scatter(
    config: mc.ModelConfig, inputs: dict[str, mc.ModelInput], outputs: dict[str, mc.ModelOutput]
) -> dict[str, ScatterSpec]:
    scatter: dict[str, ScatterSpec] = {}
    for bo in config.batch_output:
        kind = mc.BatchOutput.Kind.Name(bo.kind)
        if len(bo.source_input) != 1:
            raise ValueError(f"batch output kind '{kind}' expects 1 source input, got {len(bo.source_input)}")
        source = bo.source_input[0]
        if source not in inputs:
            raise ValueError(f"unknown source input name '{source}'")
        if not bo.target_name:
            raise ValueError(f"batch output kind '{kind}' has no target_name")
        for target in bo.target_name:
            out = outputs.get(target)
            if out is None:
                raise ValueError(f"unknown target output name '{target}'")
            if target in scatter:
                raise ValueError(f"target output name '{target}' can only be specified once")
            dims = list(out.reshape.shape) if out.HasField("reshape") else list(out.dims)
            shape = ([-1] if config.max_batch_size > 0 else []) + dims
            scatter[target] = ScatterSpec(source, tuple(shape))
    return scatter


def _pad_policy(config: mc.ModelConfig, ragged: frozenset[str]) -> tuple[tuple[int, ...], dict[str, PadSpec]]:
    param = config.parameters.get(PAD_BATCHING)
    if param is None:
        if any(k == PAD_VALUE or k.startswith((PAD_VALUE + ".", PAD_OUTPUT + ".")) for k in config.parameters):
            raise ValueError(f"'{PAD_VALUE}' and '{PAD_OUTPUT}.*' need '{PAD_BATCHING}'")
        return (), {}
    text = param.string_value.strip()
    buckets: tuple[int, ...] = ()
    if text != "max":
        try:
            buckets = tuple(int(b) for b in text.split(","))
        except ValueError:
            buckets = ()
        if not buckets or any(b <= 0 for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ValueError(
                f"parameter '{PAD_BATCHING}' must be \"max\" or ascending positive bucket sizes "
                f"such as \"16,32,64\", not {param.string_value!r}"
            )
    if config.max_batch_size <= 0 or not config.HasField("dynamic_batching"):
        raise ValueError(f"'{PAD_BATCHING}' needs dynamic_batching and max_batch_size > 0: it decides what "
                         "may share a batch")
    default = config.parameters.get(PAD_VALUE)
    padded: dict[str, PadSpec] = {}
    for i in config.input:
        positions = tuple(p for p, d in enumerate(i.dims) if d == -1)
        if not positions or i.name in ragged:
            continue
        if i.HasField("reshape"):
            raise ValueError(f"input '{i.name}' has a reshape: '{PAD_BATCHING}' pads the dims clients send, "
                             "drop the reshape")
        own = config.parameters.get(f"{PAD_VALUE}.{i.name}")
        text_value = own.string_value if own is not None else default.string_value if default is not None else "0"
        padded[i.name] = PadSpec(positions, _pad_value(i.name, _datatype(i.data_type), text_value))
    if not padded:
        raise ValueError(f"'{PAD_BATCHING}' is set but no input has a variable (-1) dimension to pad")
    for key in config.parameters:
        if key.startswith(PAD_VALUE + ".") and key[len(PAD_VALUE) + 1:] not in padded:
            raise ValueError(f"parameter '{key}' names no padded input (inputs with a -1 dim, not ragged)")
    return buckets, padded


def _pad_value(name: str, datatype: str, text: str) -> float | int | bool | bytes:
    try:
        if datatype == "BYTES":
            return text.encode()
        if datatype == "BOOL":
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        if datatype.startswith(("INT", "UINT")):
            value = int(text)
            if datatype.startswith("UINT") and value < 0:
                raise ValueError(text)
            return value
        return float(text)
    except ValueError:
        raise ValueError(f"pad value {text!r} does not fit input '{name}' of type {datatype}") from None


def _follows(
    config: mc.ModelConfig, padded: dict[str, PadSpec], outputs: dict[str, mc.ModelOutput],
    scatter: dict[str, ScatterSpec],
) -> dict[str, str]:
    follows: dict[str, str] = {}
    for o in config.output:
        dims = list(o.dims)
        explicit = config.parameters.get(f"{PAD_OUTPUT}.{o.name}")
        if explicit is not None:
            name = explicit.string_value
            if not name:
                continue
            if o.name in scatter or o.HasField("reshape"):
                raise ValueError(f"parameter '{PAD_OUTPUT}.{o.name}': a batch_output or reshaped output "
                                 "cannot be cut back")
            spec = padded.get(name)
            if spec is None:
                raise ValueError(f"parameter '{PAD_OUTPUT}.{o.name}' names '{name}', which is not a padded input")
            if not _variable_at(dims, spec.positions):
                raise ValueError(
                    f"output '{o.name}' cannot follow input '{name}': its dims {dims} are not -1 at the "
                    f"input's variable positions {list(spec.positions)}"
                )
            follows[o.name] = name
            continue
        if o.name in scatter or o.HasField("reshape"):
            continue
        for name, spec in padded.items():
            if _variable_at(dims, spec.positions):
                follows[o.name] = name
                break
    for key in config.parameters:
        if key.startswith(PAD_OUTPUT + ".") and key[len(PAD_OUTPUT) + 1:] not in outputs:
            raise ValueError(f"parameter '{key}' names no declared output")
    return follows


def _variable_at(dims: list[int], positions: tuple[int, ...]) -> bool:
    return all(p < len(dims) and dims[p] == -1 for p in positions)


def _datatype(data_type: int) -> str:
    return config_to_datatype(mc.DataType.Name(data_type))
