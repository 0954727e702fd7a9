"""``pb_utils.Tensor`` and Triton's numpy type helpers.

Input tensors wrap numpy views of shared memory (no copy); BYTES tensors are
object arrays of ``bytes``, as in Triton. A tensor made with ``from_dlpack`` from
CUDA memory (a torch ``cuda`` tensor, a cupy array) stays on the device as a cupy
array: ``is_cpu()`` is false and ``as_numpy()`` raises, as Triton's does. Returned
in a response it is copied by the worker straight to where the output goes (a CUDA
shared-memory region device-to-device, otherwise the host).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import numpy as np

from conveyor.proto.datatypes import deserialize_bytes, serialize_bytes
from conveyor.workers.backends.python.pb_utils.errors import TritonModelException

# Config type names -> numpy, as Triton's pb_utils maps them.
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType numbering (1 = BOOL ... 13 = BYTES).
_CODE_TO_NUMPY: dict[int, Any] = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8, 7: np.int16,
    8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64, 13: np.object_,
}
_NUMPY_TO_CODE: dict[Any, int] = {np.dtype(t): code for code, t in _CODE_TO_NUMPY.items()}
_DLPACK_CPU = 1  # kDLCPU
_DLPACK_CUDA = 2  # kDLCUDA
_DLPACK_CUDA_HOST = 3  # kDLCUDAHost: pinned host memory, readable as CPU memory
_TRITON_BF16 = 14  # TRITONSERVER_TYPE_BF16


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    return _CODE_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    dt = np.dtype(data_type)
    if dt.kind == "S":
        return 13
    return _NUMPY_TO_CODE.get(dt)


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray:
    """The length-prefixed wire form of a BYTES array, as a flat uint8 array."""
    return np.frombuffer(serialize_bytes(input_tensor), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """A flat object array of ``bytes`` from the length-prefixed wire form."""
    buf = memoryview(encoded_tensor).cast("B")
    count, pos = 0, 0
    while pos + 4 <= len(buf):
        pos += 4 + int.from_bytes(buf[pos : pos + 4], "little")
        count += 1
    return deserialize_bytes(buf, count)


class _Capsule:
    """Lets ``np.from_dlpack`` take a bare DLPack capsule (only CPU capsules are accepted)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DLPACK_CPU, 0)


class Tensor:
    """A named tensor: ``Tensor(name, numpy_array)``, or ``Tensor.from_dlpack`` (host or CUDA memory)."""

    def __init__(self, name: str, numpy_array: Any) -> None:
        # Triton's binding converts what numpy takes as an array and refuses the rest (None, a
        # name that is not a str) with TypeError.
        if not isinstance(name, str):
            raise TypeError(f"a tensor's name must be a str, not {type(name).__name__}")
        if numpy_array is None:
            raise TypeError(f"tensor '{name}' needs a numpy array, not None")
        if not isinstance(numpy_array, np.ndarray):
            try:
                numpy_array = np.asarray(numpy_array)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"tensor '{name}' needs a numpy array: {exc}") from None
        kind = numpy_array.dtype.kind
        if kind == "U":
            # Triton refuses str_ arrays; encoding them is the friendlier equivalent.
            numpy_array = np.vectorize(lambda s: s.encode("utf-8"), otypes=[np.object_])(numpy_array)
        elif kind == "V":
            raise TritonModelException(f"tensor '{name}': numpy dtype {numpy_array.dtype} is not supported")
        self._name = name
        self._array: Any = numpy_array
        self._device_id = -1  # the CUDA device of a device tensor; -1 on the host
        self._bf16 = False  # BF16: numpy has no such dtype; the array holds its raw 16-bit words

    @classmethod
    def _of_input(cls, name: str, array: np.ndarray) -> Tensor:
        """A request's input as the worker hands it over: a numpy array of a wire datatype, so
        none of the constructor's checks (they run for every input of every request)."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._device_id = -1
        tensor._bf16 = False
        return tensor

    @classmethod
    def _of_bf16(cls, name: str, words: np.ndarray) -> Tensor:
        """A BF16 tensor over its raw words (a BF16 input, or one imported through DLPack)."""
        tensor = cls(name, words.view(np.uint16))
        tensor._bf16 = True
        return tensor

    @classmethod
    def _on_device(cls, name: str, device_array: Any, device_id: int) -> Tensor:
        tensor = cls.__new__(cls)
        tensor._name, tensor._array, tensor._device_id, tensor._bf16 = name, device_array, device_id, False
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._device_id >= 0:
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        if self._bf16:
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() instead."
            )
        return self._array

    def data(self) -> Any:
        """The tensor's array where it lies: numpy on the host, cupy on a device (Conveyor's; for outputs)."""
        return self._array

    def host_array(self) -> np.ndarray:
        """A numpy array of the tensor, copied from the device if it is there (Conveyor's; for BLS inputs)."""
        return self._array.get() if self._device_id >= 0 else self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int | None:
        return _TRITON_BF16 if self._bf16 else numpy_to_triton_type(self._array.dtype)

    def is_bf16(self) -> bool:
        """Conveyor's: the array holds BF16 words (``as_numpy`` refuses it)."""
        return self._bf16

    def is_cpu(self) -> bool:
        return self._device_id < 0

    def to_dlpack(self) -> Any:
        if self._array.dtype == np.object_:
            raise TritonModelException("DLPack does not have support for string tensors.")
        if self._bf16:
            return _bf16_capsule(self._array)
        return self._array.__dlpack__()

    def __dlpack__(self, **kwargs: Any) -> Any:
        if self._bf16:
            return _bf16_capsule(self._array)
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DLPACK_CUDA, self._device_id) if self._device_id >= 0 else (_DLPACK_CPU, 0)

    @staticmethod
    def from_dlpack(name: str, dlpack_object: Any) -> Tensor:
        """From a DLPack capsule or any object with ``__dlpack__``: a torch tensor, a cupy or numpy array."""
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        if dlpack_object is None:
            raise TritonModelException(f"tensor '{name}': from_dlpack needs a DLPack capsule or tensor, not None")
        device = getattr(dlpack_object, "__dlpack_device__", None)
        if device is not None and device()[0] == _DLPACK_CUDA:
            return _from_cuda(name, dlpack_object)
        source = dlpack_object if hasattr(dlpack_object, "__dlpack__") else _Capsule(dlpack_object)
        try:
            array = np.from_dlpack(source)
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            # torch reads what numpy cannot (BF16, a bare capsule of CUDA memory), and opening a bare
            # capsule uses it up: what torch opened is passed on, never the spent capsule.
            opened = _torch_view(dlpack_object)
            if opened is not None:
                if opened.device.type == "cuda":
                    return _from_cuda(name, opened)
                words = _bf16_words(opened)
                if words is not None:
                    return Tensor._of_bf16(name, words)
            elif device is None:  # a bare capsule says where it lies only when opened: try the device
                try:
                    return _from_cuda(name, dlpack_object)
                except TritonModelException:
                    pass
            raise TritonModelException(f"tensor '{name}': cannot import DLPack data ({exc})") from None
        return Tensor(name, array if array.flags.writeable else _writeable_view(array))

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={list(self._array.shape)}, dtype={self._array.dtype})"


def _bf16_capsule(words: np.ndarray) -> Any:
    """A BF16 DLPack capsule over ``words`` (no copy). numpy cannot describe BF16, torch can;
    a model that reads BF16 through DLPack uses torch (or another framework torch hands it to)."""
    try:
        import torch
    except ImportError:
        raise TritonModelException("a BF16 tensor's DLPack form needs torch, which is not installed") from None
    if not words.flags.writeable:  # torch warns on read-only memory; the tensor is the model's to read
        words = words.copy()
    return torch.utils.dlpack.to_dlpack(torch.from_numpy(words.view(np.int16)).view(torch.bfloat16))


def _torch_view(dlpack_object: Any) -> Any | None:
    """``dlpack_object`` opened by torch (no copy); None when torch is not loaded or refuses it."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch.utils.dlpack.from_dlpack(dlpack_object)
    except Exception:
        return None


def _bf16_words(tensor: Any) -> np.ndarray | None:
    """The raw words of a BF16 host torch tensor (numpy refuses that dtype); None for anything else."""
    torch = sys.modules["torch"]
    if tensor.dtype != torch.bfloat16 or tensor.device.type != "cpu":
        return None
    words: np.ndarray = tensor.contiguous().view(torch.int16).numpy().view(np.uint16)
    return words


def _from_cuda(name: str, dlpack_object: Any) -> Tensor:
    """A device tensor over ``dlpack_object``'s CUDA memory (no copy), held as a cupy array."""
    try:
        import cupy
    except ImportError:
        raise TritonModelException(
            "DLPack capsule passed pointer to memory allocated on GPU device, when GPU is not available"
        ) from None
    try:
        if hasattr(dlpack_object, "__dlpack__"):
            array = cupy.from_dlpack(dlpack_object)
        else:  # a bare capsule (torch.utils.dlpack.to_dlpack): cupy's legacy entry takes it
            array = cupy.fromDlpack(dlpack_object)
    except Exception as exc:
        raise TritonModelException(f"tensor '{name}': cannot import DLPack data ({exc})") from None
    if not array.flags.c_contiguous:
        raise TritonModelException(
            "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in C-Order are supported."
        )
    return Tensor._on_device(name, array, int(array.device.id))


def _writeable_view(array: np.ndarray) -> np.ndarray:
    """The same memory, writeable. numpy marks what a legacy DLPack capsule (``torch.utils.dlpack.to_dlpack``)
    carries read-only, since that format cannot say; it then refuses to export it again, while Triton's
    tensors pass between torch and pb_utils both ways."""
    if array.nbytes == 0 or array.dtype == np.object_:
        return array
    if not array.flags.c_contiguous:
        return np.ascontiguousarray(array)  # a copy, as Triton's own import of strided data is refused
    buffer = (ctypes.c_char * array.nbytes).from_address(array.ctypes.data)
    buffer._owner = array  # type: ignore[attr-defined]  # the capsule's memory lives while the view does
    return np.frombuffer(memoryview(buffer).cast("B"), dtype=array.dtype).reshape(array.shape)
