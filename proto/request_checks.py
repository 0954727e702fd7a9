"""A request's tensors as the data plane takes them: checked against the
model's signature, then written once into a shared-memory arena.

Transport-free and process-free: the ingress runs these for its clients'
requests (``ingress/dataplane.py``), a worker for its models' BLS requests
(``workers/backends/python/bls.py``) and the router for an ensemble's steps
(``check_step_inputs``), so a bad request fails the same way, with the same
message, wherever it comes from. Messages follow Triton's.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from conveyor.proto import messages as m
from conveyor.proto.datatypes import element_count, element_size, numpy_dtype, serialize_bytes
from conveyor.proto.errors import ConveyorError, client_mistake, invalid_arg, request_prefix
from conveyor.proto.shm_params import ShmPlacement
from conveyor.proto.signature import ModelSignature

TensorData = bytes | bytearray | memoryview | np.ndarray


class InputArena(Protocol):
    """What ``write_inputs`` writes into: a process's own ``shm.arena.Arena`` (proto/ imports no shm/)."""

    name: str

    def view(self, start: int, nbytes: int) -> np.ndarray: ...

    def put(self, start: int, data: bytes) -> None: ...
_CLIENT = m.CLIENT_REGION_PREFIX


@dataclass(slots=True)
class InferInput:
    """One input: ``data`` is raw little-endian bytes (BYTES: length-prefixed) or
    an array already in the input's dtype (from JSON); or ``shm`` names where in a
    client-registered region the bytes already are (``data`` is None then)."""

    name: str
    datatype: str
    shape: list[int]
    data: TensorData | None
    parameters: dict[str, Any] = field(default_factory=dict)
    shm: ShmPlacement | None = None
    from_json: bool = False  # ``data`` came from HTTP JSON: a size mismatch is Triton's JSON parse error


@dataclass(slots=True)
class RequestedOutput:
    name: str
    classification: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)
    shm: ShmPlacement | None = None  # write it into this client region, return no bytes


def too_many_elements(name: str, count: int, limit: int) -> ConveyorError:
    return invalid_arg(
        f"input '{name}' has {count} elements, more than the {limit} this server accepts per input "
        "(--max-input-elements)"
    )


def check_inputs(
    sig: ModelSignature, inputs: list[InferInput], max_elements: int = 0, request_id: str = ""
) -> list[tuple[InferInput, int]]:
    """Each input with its byte size, or INVALID_ARG for the first thing wrong
    (``max_elements`` 0: no limit on elements per input), in Triton's order: a
    repeated input, the input count, then each input (``InferenceRequest::Normalize``).
    The messages of Triton's core start with its ``[request id: <id>] ``. Triton walks
    the inputs in its ``std::unordered_map``'s order, the reverse of the request's
    (libstdc++ puts each new node first), which decides which of two wrong inputs it
    names: so does this walk."""
    seen = _check_names_and_batch(sig, inputs, request_id)
    # Pass 2: each input's datatype, shape and bytes.
    batching = sig.max_batch_size > 0
    checked: list[tuple[InferInput, int]] = []
    for inp in reversed(inputs):
        _check_type_and_shape(sig, inp, batching, request_id)
        if max_elements and (count := element_count(inp.shape)) > max_elements:
            raise too_many_elements(inp.name, count, max_elements)
        if inp.shm is not None:
            checked.append((inp, _shm_byte_size(sig, inp, inp.shm, request_id)))
            continue
        if inp.data is None:
            raise invalid_arg(f"input '{inp.name}' has no data")
        if inp.from_json and inp.datatype != "BYTES" and inp.data.size != element_count(inp.shape):  # type: ignore[union-attr]
            # Triton's HTTP server's words and status (INTERNAL, 500)
            raise client_mistake("Unable to parse 'data': Shape does not match true shape of 'data' field")
        checked.append((inp, _byte_size(inp, sig.name, request_id)))
    _refuse_missing(sig, inputs, seen, request_id)
    checked.reverse()  # the request's order again
    return checked


class Shaped(Protocol):
    """What the name, type and shape checks read of an input: a client's ``InferInput``, or the
    ``TensorRef`` an ensemble hands its step (read only)."""

    @property
    def name(self) -> str: ...

    @property
    def datatype(self) -> str: ...

    @property
    def shape(self) -> list[int]: ...


def check_step_inputs(sig: ModelSignature, inputs: Sequence[Shaped], request_id: str = "") -> None:
    """The checks ``check_inputs`` makes of a client's request, but the bytes, for a request an ensemble
    makes of one of its steps (its tensors are in shared memory already, sized by the step before), as
    Triton's core checks every request it is given, an ensemble's steps' too."""
    seen = _check_names_and_batch(sig, inputs, request_id)
    batching = sig.max_batch_size > 0
    for inp in reversed(inputs):
        _check_type_and_shape(sig, inp, batching, request_id)
    _refuse_missing(sig, inputs, seen, request_id)


def _check_names_and_batch(sig: ModelSignature, inputs: Sequence[Shaped], request_id: str) -> set[str]:
    """Pass 1, as Triton's: a repeated input and the count, then the names, the batch dimension of each
    input and the batch size. The names seen."""
    n = len(inputs)
    if n > len(sig.inputs) or n < sig.required_inputs:
        # Triton refuses a repeated input as it is added, so before the count.
        _refuse_repeated(inputs, request_id)
        got = [inp.name for inp in reversed(inputs)]
        raise missing_inputs(sig, got, [k for k, s in sig.inputs.items() if k not in got and not s.optional],
                             request_id)
    seen: set[str] = set()
    batch: int | None = None
    batching = sig.max_batch_size > 0
    for inp in reversed(inputs):
        if inp.name in seen:
            raise invalid_arg(f"{request_prefix(request_id)}input '{inp.name}' already exists in request")
        if inp.name not in sig.inputs:
            raise invalid_arg(f"unexpected inference input '{inp.name}' for model '{sig.name}'")
        seen.add(inp.name)
        if batching:
            if not inp.shape:
                raise invalid_arg(
                    f"{request_prefix(request_id)}input '{inp.name}' has no shape but model requires batch "
                    f"dimension for '{sig.name}'"
                )
            if batch is None:
                batch = inp.shape[0]
            elif inp.shape[0] != batch:
                raise invalid_arg(
                    f"{request_prefix(request_id)}input '{inp.name}' batch size does not match other inputs for "
                    f"'{sig.name}'"
                )
    if batch is not None and batch > sig.max_batch_size:
        raise invalid_arg(
            f"{request_prefix(request_id)}inference request batch-size must be <= {sig.max_batch_size} "
            f"for '{sig.name}'"
        )
    return seen


def _check_type_and_shape(sig: ModelSignature, inp: Shaped, batching: bool, request_id: str) -> None:
    spec = sig.inputs[inp.name]
    if inp.datatype != spec.datatype:
        raise invalid_arg(
            f"{request_prefix(request_id)}inference input '{inp.name}' data-type is '{inp.datatype}', "
            f"but model '{sig.name}' expects '{spec.datatype}'"
        )
    if any(d < 0 for d in inp.shape):
        raise invalid_arg(
            f"{request_prefix(request_id)}All input dimensions should be specified for input '{inp.name}' "
            f"for model '{sig.name}', got {_fmt(inp.shape)}"
        )
    if not spec.accepts(inp.shape[1:] if batching else inp.shape):
        expected = ([-1] if batching else []) + list(spec.dims)
        raise invalid_arg(
            f"{request_prefix(request_id)}unexpected shape for input '{inp.name}' for model '{sig.name}'. "
            f"Expected {_fmt(expected)}, got {_fmt(inp.shape)}. {_BATCH_NOTE if batching else ''}"
        )


def _refuse_missing(sig: ModelSignature, inputs: Sequence[Shaped], seen: set[str], request_id: str) -> None:
    # Only with optional inputs can the count be right and a required input missing (Triton
    # lets such a request reach the backend): refused here, in the words of the count check.
    missing = [name for name, spec in sig.inputs.items() if name not in seen and not spec.optional]
    if missing:
        raise missing_inputs(sig, [inp.name for inp in reversed(inputs)], missing, request_id)


_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to "
    "each input shape. If you want to specify the full shape including the batch dim in your input dims config, "
    "try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)


def _refuse_repeated(inputs: Sequence[Shaped], request_id: str) -> None:
    seen: set[str] = set()
    for inp in inputs:
        if inp.name in seen:
            raise invalid_arg(f"{request_prefix(request_id)}input '{inp.name}' already exists in request")
        seen.add(inp.name)


def missing_inputs(sig: ModelSignature, got: list[str], missing: list[str], request_id: str = "") -> ConveyorError:
    """Triton's words (InferenceRequest::ValidateRequestInputs), its lists written as
    it writes them: no space after a comma, and ``]`` alone when nothing is missing
    (it drops the last character of ``[`` + names + ``,`` either way)."""
    required = sig.required_inputs
    expected = (
        f"expected {len(sig.inputs)} inputs" if required == len(sig.inputs)
        else f"expected number of inputs between {required} and {len(sig.inputs)}"
    )
    return invalid_arg(
        f"{request_prefix(request_id)}{expected} but got {len(got)} inputs for model '{sig.name}'. Got input(s) "
        f"{_names(got)}, but missing required input(s) {_names(missing) if missing else ']'}. Please provide all "
        "required input(s)."
    )


def _names(names: list[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def check_outputs(
    sig: ModelSignature, outputs: list[RequestedOutput] | None, request_id: str = ""
) -> list[m.OutputSpec]:
    """The outputs to produce (``None``: every output of the model)."""
    if outputs is None:
        return [m.OutputSpec(name) for name in sig.outputs]
    if len(outputs) > 1:
        # As Triton, which refuses a repeated output as it is added, before any name is checked.
        named: set[str] = set()
        for out in outputs:
            if out.name in named:
                raise invalid_arg(f"{request_prefix(request_id)}output '{out.name}' already exists in request")
            named.add(out.name)
    specs: list[m.OutputSpec] = []
    for out in outputs:
        if out.name not in sig.outputs:
            raise invalid_arg(f"unexpected inference output '{out.name}' for model '{sig.name}'")
        if out.classification < 0:
            raise invalid_arg(f"classification count for output '{out.name}' must be positive")
        shm = out.shm
        if shm is None:
            specs.append(m.OutputSpec(out.name, out.classification))
        else:
            specs.append(m.OutputSpec(out.name, out.classification, shm.region, shm.offset, shm.byte_size))
    return specs


MAX_VERDICTS = 64


def remember_verdict(
    sig: ModelSignature, key: Hashable, inputs: list[tuple[InferInput, int]], outputs: list[m.OutputSpec],
    uses_shm: bool,
) -> None:
    """Keep the checks' verdict on a call for the later calls with its ``shape_key``. Not for a call
    with BYTES inputs: their element counts are read from the bytes, which differ call to call."""
    if any(inp.datatype == "BYTES" for inp, _ in inputs):
        return
    verdicts = sig.verdicts
    if len(verdicts) >= MAX_VERDICTS:
        verdicts.clear()
    verdicts[key] = ([n for _, n in inputs], list(outputs), uses_shm)


def inputs_nbytes(inputs: list[tuple[InferInput, int]]) -> int:
    """The arena block ``write_inputs`` needs for these checked inputs."""
    total = 0
    for inp, nbytes in inputs:
        if inp.shm is None:
            total += (nbytes + 63) & ~63  # ``aligned``, inline
    return total


def write_inputs(arena: InputArena, block: int, inputs: list[tuple[InferInput, int]]) -> list[m.TensorRef]:
    """Copy the checked inputs into ``block`` of ``arena`` (the one copy of their
    bytes) and describe them; inputs in a client's region are referenced by name."""
    refs: list[m.TensorRef] = []
    offset = block
    for inp, nbytes in inputs:
        shm = inp.shm
        if shm is not None:
            # Already in the client's region: the router resolves the name.
            refs.append(m.TensorRef(inp.name, inp.datatype, inp.shape, _CLIENT + shm.region, shm.offset, nbytes))
            continue
        data = inp.data
        if isinstance(data, np.ndarray):
            dtype = np.uint8 if inp.datatype == "BYTES" else numpy_dtype(inp.datatype)
            arena.view(offset, nbytes)[:] = np.ascontiguousarray(data, dtype=dtype).reshape(-1).view(np.uint8)
        elif len(data) == nbytes:  # type: ignore[arg-type]
            # Bytes, or a view of them: through the mapping, about 1.5 µs less than a numpy copy.
            arena.put(offset, data)  # type: ignore[arg-type]
        else:  # a view of wider items: numpy reads its bytes (or refuses a size that does not fit)
            arena.view(offset, nbytes)[:] = np.frombuffer(data, dtype=np.uint8)  # type: ignore[arg-type]
        refs.append(m.TensorRef(inp.name, inp.datatype, inp.shape, arena.name, offset, nbytes))
        offset += aligned(nbytes)
    return refs


def aligned(nbytes: int) -> int:
    """Each tensor starts on a 64-byte boundary, so backends get aligned views."""
    return (nbytes + 63) & ~63


def _shm_byte_size(sig: ModelSignature, inp: InferInput, shm: ShmPlacement, request_id: str) -> int:
    if inp.data is not None:
        raise invalid_arg(f"input '{inp.name}' has both data and a shared memory region")
    if inp.datatype != "BYTES":
        expected = element_count(inp.shape) * element_size(inp.datatype)
        if shm.byte_size != expected:
            raise invalid_arg(
                f"{request_prefix(request_id)}input byte size mismatch for input '{inp.name}' for model "
                f"'{sig.name}'. Expected {expected}, got {shm.byte_size}"
            )
    return shm.byte_size


def _byte_size(inp: InferInput, model: str, request_id: str) -> int:
    count = element_count(inp.shape)
    data = inp.data
    # A BYTES array of uint8 is the wire form this check made of it already (below): a call checked
    # again (against a fresh signature, or sent once more) is read as the bytes it is, not as elements.
    if isinstance(data, np.ndarray) and not (inp.datatype == "BYTES" and data.dtype == np.uint8):
        if data.size != count:
            raise invalid_arg(request_prefix(request_id) + (
                f"unexpected number of string elements {data.size} for inference input '{inp.name}' for model "
                f"'{model}', expecting {count}"
                if inp.datatype == "BYTES"
                else f"input byte size mismatch for input '{inp.name}' for model '{model}'. "
                f"Expected {count * element_size(inp.datatype)}, got {data.size * element_size(inp.datatype)}"
            ))
        if inp.datatype == "BYTES":
            inp.data = data = np.frombuffer(serialize_bytes(data), dtype=np.uint8)
            return data.nbytes
        return count * element_size(inp.datatype)
    nbytes = memoryview(data).nbytes  # type: ignore[arg-type]
    if inp.datatype == "BYTES":
        _check_bytes_count(inp.name, model, data, count, request_id)  # type: ignore[arg-type]
        return nbytes
    expected = count * element_size(inp.datatype)
    if nbytes != expected:
        raise invalid_arg(
            f"{request_prefix(request_id)}input byte size mismatch for input '{inp.name}' for model '{model}'. "
            f"Expected {expected}, got {nbytes}"
        )
    return nbytes


def _check_bytes_count(name: str, model: str, data: bytes | memoryview, count: int, request_id: str) -> None:
    """Walk the length prefixes without building objects (Triton's checks and wording)."""
    tag = request_prefix(request_id)
    mv = memoryview(data).cast("B")
    pos, end, n = 0, len(mv), 0
    while pos < end:
        if pos + 4 > end:
            raise invalid_arg(
                f"{tag}incomplete string length indicator for inference input '{name}' for model '{model}', "
                f"expecting 4 bytes but only {end - pos} bytes available. Please make sure the string length "
                "indicator is in one buffer."
            )
        pos += 4 + int.from_bytes(mv[pos : pos + 4], "little")
        n += 1
        if n > count:
            raise invalid_arg(
                f"{tag}unexpected number of string elements {n} for inference input '{name}' for model '{model}', "
                f"expecting {count}"
            )
    if pos > end:  # Triton does not check this: its backends would read past the tensor
        raise invalid_arg(
            f"{tag}incomplete string data for inference input '{name}' for model '{model}': the last element "
            f"needs {pos - end} more bytes"
        )
    if n != count:
        raise invalid_arg(
            f"{tag}expected {count} string elements for inference input '{name}' for model '{model}', got {n}"
        )


def _fmt(shape: list[int] | tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"
