"""The Python backend's tensors with torch: a CPU tensor in and out through DLPack without a copy, and a BF16
tensor (no NumPy type) as torch reads it. Slow: torch's import takes seconds (and runs ldconfig)."""

from __future__ import annotations

import numpy as np
import pytest

from conveyor.workers.backends.python import pb_utils

LEVEL = "slow"


def test_torch_cpu_tensor_through_dlpack() -> None:
    """A torch CPU tensor in and out, without a copy, as a model moving data between torch and pb_utils does."""
    torch = pytest.importorskip("torch")
    t = torch.arange(8, dtype=torch.float32)
    tensor = pb_utils.Tensor.from_dlpack("T", torch.utils.dlpack.to_dlpack(t))
    assert tensor.is_cpu() and tensor.as_numpy().ctypes.data == t.data_ptr()
    back = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    assert back.data_ptr() == t.data_ptr()


def test_a_bf16_tensor_is_not_numpy() -> None:
    torch = pytest.importorskip("torch")
    words = np.array([0x3FC0, 0xC000], np.uint16)  # 1.5, -2.0 in BF16
    tensor = pb_utils.Tensor._of_bf16("B", words)
    with pytest.raises(pb_utils.TritonModelException, match="Tensor dtype is BF16 and cannot be converted to NumPy"):
        tensor.as_numpy()
    assert tensor.triton_dtype() == 14
    as_torch = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    assert as_torch.dtype == torch.bfloat16 and as_torch.tolist() == [1.5, -2.0]
    back = pb_utils.Tensor.from_dlpack("C", torch.utils.dlpack.to_dlpack(as_torch * 2))
    with pytest.raises(pb_utils.TritonModelException):
        back.as_numpy()
    assert back.data().tolist() == [0x4040, 0xC080]  # 3.0, -4.0
