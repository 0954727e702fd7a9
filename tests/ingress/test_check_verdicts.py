"""The data plane checks a request shape once: calls that share a ``shape_key`` (a request
template) reuse the first one's verdict, kept on the model's signature; BYTES inputs and
refused calls leave no verdict behind."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conveyor.ingress import dataplane as dataplane_module
from conveyor.ingress.dataplane import InferCall
from conveyor.proto.errors import ConveyorError
from conveyor.proto.request_checks import InferInput, check_inputs
from conveyor.proto.signature import ModelSignature
from tests.support.fuzz_data_plane import SIGNATURE, data_plane

LEVEL = "unit"


def call(key: object, data: bytes = bytes(8), strings: bytes | None = None) -> InferCall:
    """``F`` (FP32 [1, 2]) from ``data``, and ``S`` (BYTES [1, 2]) from ``strings`` if given."""
    inputs = [InferInput("F", "FP32", [1, 2], memoryview(data))]
    if strings is not None:
        inputs.append(InferInput("S", "BYTES", [1, 2], memoryview(strings)))
    return InferCall("m", "", inputs, shape_key=key)


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The input names of each call ``check_inputs`` checks."""
    seen: list[str] = []
    real = dataplane_module.check_inputs

    def counting(sig: Any, inputs: list[InferInput], *args: Any) -> Any:
        seen.append("".join(inp.name for inp in inputs))
        return real(sig, inputs, *args)

    monkeypatch.setattr(dataplane_module, "check_inputs", counting)
    return seen


async def test_calls_sharing_a_key_are_checked_once(checks: list[str]) -> None:
    key = object()
    with data_plane() as dp:
        for value in (1.0, 2.0, 3.0):
            await dp.infer(call(key, data=np.full(2, value, np.float32).tobytes()))
        await dp.infer(call(None))
        sent = dp.link.requests  # type: ignore[attr-defined]
    assert checks == ["F", "F"]  # the keyed calls once, the unkeyed one
    assert [r.inputs[0].nbytes for r in sent] == [8, 8, 8, 8]


async def test_a_refused_shape_is_refused_every_time(checks: list[str]) -> None:
    key = object()
    with data_plane() as dp:
        for _ in range(2):
            with pytest.raises(ConveyorError, match="input byte size mismatch"):
                await dp.infer(call(key, data=bytes(4)))
    assert checks == ["F", "F"]  # no verdict was kept: each call was checked


async def test_bytes_inputs_are_checked_every_time(checks: list[str]) -> None:
    key = object()
    one = (1).to_bytes(4, "little") + b"a"
    with data_plane() as dp:
        await dp.infer(call(key, strings=one + one))
        with pytest.raises(ConveyorError, match="unexpected number of string elements 3"):
            await dp.infer(call(key, strings=one + one + one))  # same key, strings that do not fit
    assert checks[:2] == ["FS", "FS"]


def test_a_call_checked_again_reads_its_bytes_inputs_wire_form_as_bytes() -> None:
    """The check writes a BYTES array as its wire form into the call (the one copy the arena takes). A call
    checked again (the data plane's second look against a fresh signature, a request sent once more) reads
    that form as the bytes it is: not as 4 + len elements ('unexpected number of string elements 63')."""
    sig = ModelSignature.from_wire(SIGNATURE)
    strings = InferInput("S", "BYTES", [1, 2], np.array([b"ab", b"cde"], dtype=object))
    inputs = [InferInput("F", "FP32", [1, 2], np.zeros(2, dtype=np.float32)), strings]
    first = [size for _, size in check_inputs(sig, inputs)]
    assert isinstance(strings.data, np.ndarray) and strings.data.dtype == np.uint8  # its wire form now
    assert [size for _, size in check_inputs(sig, inputs)] == first == [8, 13]
    with pytest.raises(ConveyorError, match=r"expected 3 string elements for inference input 'S'.*got 2"):
        check_inputs(sig, [InferInput("S", "BYTES", [1, 3], strings.data), inputs[0]])  # still counted
