"""Triton's ``sequence_batching`` block of config.pbtxt, read once and checked as
Triton checks it at load. The router schedules with it, the worker synthesizes
the control tensors and keeps the implicit state it describes.

* Strategy: ``oldest`` when given, otherwise ``direct`` (Triton's default).
* ``max_sequence_idle_microseconds``: 0 means Triton's default, 1 s.
* Slots per instance: ``max_batch_size`` (at least 1); for ``oldest``,
  ``max_candidate_sequences`` when set.
* Control inputs: START, END and READY are boolean controls given as
  ``fp32_false_true``, ``int32_false_true`` or ``bool_false_true`` (exactly
  one, two values); CORRID has a ``data_type`` (an integer type or STRING).
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.datatypes import config_to_datatype

IDLE_DEFAULT_US = 1_000_000  # Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS

_Control = mc.ModelSequenceBatching.Control
START, READY, END, CORRID = (
    _Control.CONTROL_SEQUENCE_START, _Control.CONTROL_SEQUENCE_READY,
    _Control.CONTROL_SEQUENCE_END, _Control.CONTROL_SEQUENCE_CORRID,
)
_CORRID_TYPES = (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING)


@dataclass(frozen=True, slots=True)
class FlagControl:
    """A START/END/READY input: a [1] tensor per row holding ``false`` or ``true``."""

    name: str
    datatype: str  # FP32, INT32 or BOOL
    false: float | int | bool
    true: float | int | bool


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One implicit state: fed as ``input_name``, read back from ``output_name``."""

    input_name: str
    output_name: str
    datatype: str
    initial_dims: tuple[int, ...]  # a fresh state's shape (without the batch dimension)
    data_file: str = ""  # under <model>/initial_state/; empty: zeros


@dataclass(frozen=True, slots=True)
class SequenceConfig:
    oldest: bool
    max_idle_ns: int
    slots: int  # sequences one instance holds at once
    max_batch_size: int
    start: FlagControl | None = None
    end: FlagControl | None = None
    ready: FlagControl | None = None
    corrid_name: str = ""
    corrid_datatype: str = ""
    states: tuple[StateSpec, ...] = ()
    max_delay_ns: int = 0  # direct or oldest max_queue_delay_microseconds
    min_slot_utilization: float = 0.0  # direct only
    preferred: frozenset[int] = frozenset()  # oldest only; empty: max_batch_size

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> SequenceConfig:
        """Raises ValueError with Triton's kind of message when the block is wrong."""
        sb = config.sequence_batching
        batch = max(config.max_batch_size, 1)
        flags: dict[int, FlagControl] = {}
        corrid: tuple[str, str] = ("", "")
        for ci in sb.control_input:
            if not ci.name:
                raise ValueError("sequence batching control input must have a name")
            if len(ci.control) != 1:
                raise ValueError(f"sequence batching control input '{ci.name}' must have exactly one control")
            control = ci.control[0]
            kind = _Control.Kind.Name(control.kind)
            if control.kind in flags or (control.kind == CORRID and corrid[0]):
                raise ValueError(f"sequence batching specifies multiple {kind} tensors for {config.name}")
            if control.kind == CORRID:
                if control.data_type not in _CORRID_TYPES:
                    raise ValueError(
                        f"unexpected control data type, expected TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32, "
                        f"or TYPE_STRING for {kind} for {config.name}"
                    )
                corrid = (ci.name, _datatype(control.data_type))
            else:
                flags[control.kind] = _flag_control(ci.name, kind, control)
        preferred: frozenset[int] = frozenset()
        if sb.HasField("oldest"):
            oldest = sb.oldest
            slots = oldest.max_candidate_sequences if oldest.max_candidate_sequences > 0 else batch
            for size in oldest.preferred_batch_size:
                if not 0 < size <= batch:
                    raise ValueError("sequence batching preferred batch size must be in [1, max_batch_size]")
            preferred = frozenset(oldest.preferred_batch_size)
            delay_us, utilization = oldest.max_queue_delay_microseconds, 0.0
        else:
            slots = batch
            delay_us, utilization = sb.direct.max_queue_delay_microseconds, sb.direct.minimum_slot_utilization
        return cls(
            oldest=sb.HasField("oldest"),
            max_idle_ns=(sb.max_sequence_idle_microseconds or IDLE_DEFAULT_US) * 1000,
            slots=slots,
            max_batch_size=config.max_batch_size,
            start=flags.get(START),
            end=flags.get(END),
            ready=flags.get(READY),
            corrid_name=corrid[0],
            corrid_datatype=corrid[1],
            states=tuple(_state(s) for s in sb.state),
            max_delay_ns=delay_us * 1000,
            min_slot_utilization=utilization,
            preferred=preferred,
        )

    @property
    def string_ids(self) -> bool:
        """CORRID is a STRING tensor: sequence ids must be strings (integer ids otherwise)."""
        return self.corrid_datatype == "BYTES"


def sequence_batched(config: mc.ModelConfig) -> bool:
    """Its requests are scheduled as sequences (``SequenceConfig``). Not so with
    ``iterative_sequence``: each request is a sequence of its own, which its (Python) model
    reschedules until it is done (``set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)``,
    run again on the same instance by the backend): no correlation id, no slot, no state."""
    return config.HasField("sequence_batching") and not config.sequence_batching.iterative_sequence


def sequence_problem(config: mc.ModelConfig) -> str:
    """The first ``sequence_batching`` setting Triton would refuse to load, or ''."""
    if not sequence_batched(config):
        return ""
    try:
        SequenceConfig.from_config(config)
    except ValueError as exc:
        return str(exc)
    return ""


def _datatype(data_type: int) -> str:
    return config_to_datatype(mc.DataType.Name(data_type))


def _flag_control(name: str, kind: str, control: mc.ModelSequenceBatching.Control) -> FlagControl:
    given = [
        (field, values) for field, values in (
            ("FP32", list(control.fp32_false_true)),
            ("INT32", list(control.int32_false_true)),
            ("BOOL", list(control.bool_false_true)),
        ) if values
    ]
    if len(given) != 1:
        raise ValueError(
            f"sequence batching control '{kind}' of input '{name}' must specify exactly one of "
            "'int32_false_true', 'fp32_false_true' or 'bool_false_true'"
        )
    datatype, values = given[0]
    if len(values) != 2:
        raise ValueError(
            f"sequence batching control '{kind}' of input '{name}' must have exactly 2 false/true values"
        )
    return FlagControl(name, datatype, values[0], values[1])


def _state(state: mc.ModelSequenceBatching.State) -> StateSpec:
    name = state.input_name
    if not name or not state.output_name:
        raise ValueError("sequence batching state must have an input_name and an output_name")
    if state.data_type == mc.TYPE_INVALID:
        raise ValueError(f"state '{name}': data_type must be set")
    if len(state.initial_state) > 1:
        raise ValueError(
            f"initial_state field for state input '{name}' must contain exactly one or zero element. "
            f"Found '{len(state.initial_state)}' elements."
        )
    datatype = _datatype(state.data_type)
    if not state.initial_state:
        # Triton hands a first request "uninitialized" state, 1 for each variable dimension;
        # Conveyor's is zeros, so the model sees the same thing every time.
        return StateSpec(name, state.output_name, datatype, tuple(1 if d < 0 else d for d in state.dims))
    initial = state.initial_state[0]
    if initial.data_type != state.data_type:
        raise ValueError(
            f"The data type used for 'initial_state' field of state '{name}' does not match the state data type."
        )
    if not initial.name:
        raise ValueError(f"Field 'name' must be set when using initial_state for state input '{name}'.")
    if len(initial.dims) != len(state.dims):
        raise ValueError(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input "
            f"'{name}'. {len(initial.dims)} != {len(state.dims)}"
        )
    for have, want in zip(initial.dims, state.dims, strict=True):
        if have < 0:
            raise ValueError(f"'initial_state' field for state input name '{name}' contains variable dimensions.")
        if want >= 0 and have != want:
            raise ValueError(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim description. {have} != {want}"
            )
    which = initial.WhichOneof("state_data")
    if which is None:
        raise ValueError(f"initial_state setting expects state '{name}' to have state_data set")
    return StateSpec(
        name, state.output_name, datatype, tuple(initial.dims), initial.data_file if which == "data_file" else ""
    )
