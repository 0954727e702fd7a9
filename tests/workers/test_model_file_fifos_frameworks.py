"""The model file of each framework backend installed here (ONNX Runtime, TorchScript, FIL, OpenVINO), a FIFO:
refused at once as UNAVAILABLE in Triton's words (test_model_file_fifos.py says why, and tests the rest). Slow:
the frameworks' imports take seconds (and torch's runs ldconfig)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.proto.errors import Status
from tests.support.fifos import Fifos, checked, config, refused, unreadable

LEVEL = "slow"

RELEASE_S = 20.0  # a bound, never a measure
@pytest.fixture
def fifos() -> Iterator[Fifos]:
    yield from checked(RELEASE_S)


def test_framework_model_file_fifos(tmp_path: Path, fifos: Fifos) -> None:
    from conveyor.workers.backends.fil.forests import load_forest
    from conveyor.workers.backends.onnxruntime.backend import OnnxRuntimeBackend
    from conveyor.workers.backends.openvino.backend import check_model_files
    from conveyor.workers.backends.pytorch.backend import TorchScriptBackend

    io = ('input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ] '
          'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]')
    onnx_file = fifos.make(tmp_path / "model.onnx")
    error = refused(lambda: OnnxRuntimeBackend(onnx_file, config(f'name: "m" {io}'), "cpu"))
    assert (error.status, error.message) == (Status.UNAVAILABLE, unreadable(onnx_file))
    model_pt = fifos.make(tmp_path / "model.pt")
    error = refused(lambda: TorchScriptBackend(model_pt, config(f'name: "m" {io}'), "cpu"))
    assert (error.status, error.message) == (Status.UNAVAILABLE, unreadable(model_pt))
    forest = fifos.make(tmp_path / "xgboost.json")
    assert refused(lambda: load_forest("xgboost_json", forest, 1)).message == unreadable(forest)
    model_xml = fifos.make(tmp_path / "model.xml")
    assert refused(lambda: check_model_files(model_xml, "m")).message == unreadable(model_xml)
    (tmp_path / "ir").mkdir()
    (tmp_path / "ir" / "model.xml").write_text("<net/>")
    weights = fifos.make(tmp_path / "ir" / "model.bin")
    assert refused(lambda: check_model_files(str(tmp_path / "ir" / "model.xml"), "m")).message == unreadable(weights)
