"""What a torch instance does with its config's tensors, whichever file it serves (TorchScript's ``model.pt``,
``backend.py``; a PyTorch 2 package's ``model.pt2``, ``aoti.py``): the torch type of each of Triton's config
types, the instance's device, which tensors the model takes and returns, and arrays to and from tensors.

A sequence model takes and returns more than its config declares, as Triton's libtorch backend counts them:
the sequence batcher's control inputs and implicit states are arguments after the declared inputs, and each
state's output is a returned value numbered as the declared outputs are, after them.

Inputs become tensors without a copy: ``torch.from_numpy`` over the shared-memory views, DLPack over a
client's CUDA arrays. A GPU instance hands its outputs back as cupy arrays over the same device memory
(DLPack), so the worker copies them device-to-device into a client's CUDA region, or once to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import internal, invalid_arg, unavailable
from conveyor.proto.repository_files import check_regular, unreadable
from conveyor.workers.backends.pytorch.naming import output_positions
from conveyor.workers.client_regions import is_device_array

try:
    import torch
except ImportError:  # this module is imported only to load a model: say why it cannot be
    raise unavailable("PyTorch is not installed in the worker's environment (pip install 'conveyor[torch]')") from None

# Triton's config types that torch tensors can hold (TYPE_STRING is a TorchScript List[str] instead).
TORCH_DTYPES: dict[int, Any] = {
    mc.TYPE_BOOL: torch.bool, mc.TYPE_UINT8: torch.uint8, mc.TYPE_INT8: torch.int8, mc.TYPE_INT16: torch.int16,
    mc.TYPE_INT32: torch.int32, mc.TYPE_INT64: torch.int64, mc.TYPE_FP16: torch.float16,
    mc.TYPE_FP32: torch.float32, mc.TYPE_FP64: torch.float64, mc.TYPE_BF16: torch.bfloat16,
}


def torch_device(device: str) -> Any:
    """The torch device of an instance's ``device`` (``cpu`` or ``cuda:N``); UNAVAILABLE for a GPU torch cannot see."""
    found = torch.device(device if device.startswith("cuda") else "cpu")
    if found.type == "cuda" and not torch.cuda.is_available():
        raise unavailable(f"the config asks for a GPU instance ({device}) but torch {torch.__version__} "
                          f"sees no CUDA device (a CPU build, or no GPU)")
    return found


def check_file(path: str) -> None:
    """UNAVAILABLE unless the model file is a regular file: torch opens it by name again (a name swapped after
    this check is not seen), and a FIFO would hold the instance's thread for ever (proto/repository_files.py)."""
    try:
        check_regular(path)
    except OSError as exc:
        raise unavailable(unreadable(path, exc)) from None


def sequence_inputs(config: mc.ModelConfig) -> dict[str, int]:
    """The tensors a sequence batcher adds to each request, which the model takes as inputs too (as Triton's
    backend counts them): its control inputs (a flag's type is the int/fp32/bool of its values; only CORRID's is
    declared, and only a STRING one matters here) and its implicit states. Name: config type."""
    if not config.HasField("sequence_batching"):
        return {}
    sb = config.sequence_batching
    extra: dict[str, int] = {ci.name: ci.control[0].data_type if ci.control else mc.TYPE_INVALID
                             for ci in sb.control_input}
    extra.update({s.input_name: s.data_type for s in sb.state})
    return extra


def device_array(value: Any) -> Any:
    """A cupy array over a CUDA tensor's memory (DLPack keeps the tensor alive); a host copy without cupy."""
    try:
        import cupy
    except ImportError:
        return value.cpu().numpy()
    return cupy.from_dlpack(value)


def check_one_to_one(positions: dict[str, int], names: Sequence[str], arguments: str) -> None:
    """UNAVAILABLE unless the inputs ``names`` take the positions 0..n-1 once each (``arguments``: whose)."""
    if sorted(positions.values()) != list(range(len(names))):
        raise unavailable(f"input names {list(names)} do not map one to one onto {arguments}")


class Tensors:
    """One instance's tensors, by config name: each input's type (the sequence batcher's included) and each
    output's type and position among the returned values (the implicit states' outputs included)."""

    def __init__(self, config: mc.ModelConfig, device: Any) -> None:
        self.device = device
        extra = sequence_inputs(config)
        # The arguments' names in the order Triton numbers them: the declared inputs, then the sequence's.
        self.input_names = [i.name for i in config.input] + list(extra)
        self.input_types = {**extra, **{i.name: i.data_type for i in config.input}}
        # A state output that is also a declared output is one value.
        self.output_types = {o.name: o.data_type for o in config.output}
        for state in config.sequence_batching.state:
            self.output_types.setdefault(state.output_name, state.data_type)
        self.output_positions = output_positions(list(self.output_types))

    def to_torch(self, name: str, arr: Any) -> Any:
        dtype = self.input_types.get(name)
        if dtype == mc.TYPE_STRING:
            return [_decode(name, b) for b in np.asarray(arr).reshape(-1)]
        if is_device_array(arr):
            t = torch.from_dlpack(arr)
        else:
            arr = np.asarray(arr)
            if not arr.flags.writeable:
                # A client segment mapped read-only: torch tensors are writable, so this is the one copy.
                arr = arr.copy()
            t = torch.from_numpy(arr)
        if dtype == mc.TYPE_BF16:  # travels as raw 2-byte words
            t = t.view(torch.bfloat16)
        return t.to(self.device)

    def outputs(self, values: Sequence[Any], outputs: list[str]) -> dict[str, Any]:
        """The asked ``outputs`` of the model's returned ``values``, as arrays."""
        out = {}
        for name in outputs:
            index = self.output_positions.get(name, -1)
            if not 0 <= index < len(values):
                raise internal(f"output '{name}' is at position {index} but the model returned {len(values)} values")
            out[name] = self.from_torch(name, values[index])
        return out

    def from_torch(self, name: str, value: Any) -> Any:
        expected = self.output_types.get(name)
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            if expected != mc.TYPE_STRING:
                raise internal(f"output '{name}': the model returned List[str] but the config declares "
                               f"{mc.DataType.Name(expected or 0)}")
            return np.array([s.encode("utf-8") for s in value], dtype=np.object_)
        if not isinstance(value, torch.Tensor):
            raise internal(f"output '{name}': the model returned {type(value).__name__}, "
                           f"not a Tensor or List[str]")
        if expected is not None and TORCH_DTYPES.get(expected) != value.dtype:
            raise internal(f"configuration expects datatype {mc.DataType.Name(expected)} for output '{name}', "
                           f"model provides {value.dtype}")
        value = value.detach()
        if value.dtype == torch.bfloat16:
            value = value.view(torch.int16)  # numpy and the wire have no bfloat16: its raw 2-byte words
        arr = device_array(value) if value.device.type == "cuda" else value.numpy()
        return arr.view(np.uint16) if expected == mc.TYPE_BF16 else arr


def _decode(name: str, item: Any) -> str:
    try:
        return item.decode("utf-8") if isinstance(item, bytes) else str(item)
    except UnicodeDecodeError:
        raise invalid_arg(f"input '{name}': TorchScript strings must be UTF-8") from None
