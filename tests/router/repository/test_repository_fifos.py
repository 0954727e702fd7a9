"""What the router's repository agent reads of a model, each a FIFO in turn: the config (read as it
is, and renamed for a directory registered under another name), an ONNX model whose config is
completed from its graph, a Python model's model.py (its auto_complete_config), an OpenVINO model
completed in a child process. Each is refused at once in Triton's words; the FIFO is released after
a bound only so that a regression fails instead of hanging."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.deploy.example_repo import identity, write_model
from conveyor.router.repository.prepare import SpecSettings, model_spec, prepare
from conveyor.router.repository.scan import load_spec, scan
from tests.support.fifos import Fifos, checked

LEVEL = "unit"

RELEASE_S = 20.0  # a bound, never a measure


def unreadable(path: str | Path) -> str:
    return f"failed to open text file for read {path}: a FIFO, not a regular file"


@pytest.fixture
def fifos() -> Iterator[Fifos]:
    yield from checked(RELEASE_S)


def test_a_config_fifo_makes_that_model_unavailable(tmp_path: Path, fifos: Fifos) -> None:
    identity(str(tmp_path), "ok")
    identity(str(tmp_path), "m")
    (tmp_path / "m" / "config.pbtxt").unlink()
    config = fifos.make(tmp_path / "m" / "config.pbtxt")
    specs = scan([str(tmp_path)])
    assert specs["m"].error == unreadable(config)
    assert specs["ok"].error == ""
    # A load reads it on a load thread of the agent: the same answer, and the directory is fingerprinted.
    done = prepare("m", str(tmp_path / "m"), None, None, SpecSettings())
    assert done.spec.error == unreadable(config) and done.print


def test_a_registered_directory_under_another_name(tmp_path: Path, fifos: Fifos) -> None:
    """SageMaker's registrations serve a directory under a mapped name: its config is read renamed."""
    identity(str(tmp_path), "dir")
    (tmp_path / "dir" / "config.pbtxt").unlink()
    config = fifos.make(tmp_path / "dir" / "config.pbtxt")
    spec = model_spec("mapped", str(tmp_path / "dir"), None, SpecSettings(registered=frozenset({str(tmp_path)})))
    assert spec.error == unreadable(config)


def test_model_files_read_to_complete_a_config(tmp_path: Path, fifos: Fifos) -> None:
    write_model(tmp_path, "onnx", 'name: "onnx" backend: "onnxruntime"')
    onnx_file = fifos.make(tmp_path / "onnx" / "1" / "model.onnx")
    assert load_spec("onnx", str(tmp_path / "onnx")).error == f"model 'onnx': {unreadable(onnx_file)}"
    write_model(tmp_path, "py", 'name: "py" backend: "python"')
    model_py = fifos.make(tmp_path / "py" / "1" / "model.py")
    assert load_spec("py", str(tmp_path / "py")).error == f"model 'py': {unreadable(model_py)}"
    write_model(tmp_path, "ov", 'name: "ov" backend: "openvino"')
    model_xml = fifos.make(tmp_path / "ov" / "1" / "model.xml")
    assert load_spec("ov", str(tmp_path / "ov")).error == f"model 'ov': {unreadable(model_xml)}"
