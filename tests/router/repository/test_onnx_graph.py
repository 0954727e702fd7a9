"""An ONNX model's signature read from its wire format (proto/onnx_graph.py): the
same inputs, outputs and initializer names as ``onnx.load``, without reading the weights
(whether inside the graph or beside it), and a clear error for what is no model."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest

from conveyor.deploy.example_repo import add_sub
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.onnx_graph import external_files, read_signature
from conveyor.router.repository.onnx_autocomplete import complete_onnx
from tests.support.external_data_models import big_embedding, model_directory, scale_shift

LEVEL = "unit"


def _same_as_onnx_load(path: str) -> None:
    ours, theirs = read_signature(path), onnx.load(path, load_external_data=False).graph
    assert list(ours.input) == list(theirs.input)
    assert list(ours.output) == list(theirs.output)
    assert [t.name for t in ours.initializer] == [t.name for t in theirs.initializer]


def _bytes_read() -> int:
    with open("/proc/self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def test_the_signature_is_onnx_loads(tmp_path: Path) -> None:
    add_sub(str(tmp_path), "simple", 8)
    _same_as_onnx_load(str(tmp_path / "simple" / "1" / "model.onnx"))
    _same_as_onnx_load(os.path.join(model_directory(str(tmp_path), "external"), "model.onnx"))
    big_embedding(str(tmp_path), "inline", 4, external=False)
    _same_as_onnx_load(str(tmp_path / "inline" / "1" / "model.onnx"))


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts the bytes read through /proc/self/io")
def test_weights_inside_the_graph_are_never_read(tmp_path: Path) -> None:
    path = big_embedding(str(tmp_path), "inline", 64, external=False)
    before = _bytes_read()
    graph = read_signature(path)
    assert _bytes_read() - before < 1 << 20  # of 64 MiB: onnx.load parses all of it, holding the GIL
    assert [t.name for t in graph.initializer] == ["W"] and not graph.initializer[0].raw_data
    config = mc.ModelConfig(name="inline")
    assert complete_onnx(config, path, False) == ""
    assert [(t.name, list(t.dims)) for t in config.input] == [("I", [1])] and config.max_batch_size == 4


@pytest.mark.parametrize("content", [b"", b"name: \"m\"\nplatform: \"onnxruntime_onnx\"\n", b"\x0a\xff\xff\xff\xff\x0f",
                                     b"\x3a\x05\x5a\x10abc"])
def test_what_is_no_model_says_so(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    if content:
        with pytest.raises(ValueError):
            read_signature(str(path))
    else:
        assert len(read_signature(str(path)).input) == 0  # an empty message is a valid, empty model
    config = mc.ModelConfig(name="m")
    problem = complete_onnx(config, str(path), False)
    if content:
        assert problem.startswith(f"cannot read '{path}' to complete its config"), problem
    else:
        assert problem == ""


def _onnx_locations(path: str) -> list[str]:
    folder = os.path.dirname(path)
    graph = onnx.load(path, load_external_data=False).graph
    return sorted({os.path.join(folder, entry.value) for tensor in graph.initializer
                   for entry in tensor.external_data if entry.key == "location"})


@pytest.mark.parametrize("one_file", [True, False])
def test_the_external_files_are_the_locations_onnx_reads(tmp_path: Path, one_file: bool) -> None:
    """The worker checks these files before ONNX Runtime opens them; it reads them without onnx's messages."""
    path = str(tmp_path / "model.onnx")
    onnx.save_model(scale_shift(), path, save_as_external_data=True, all_tensors_to_one_file=one_file,
                    location="weights.bin", size_threshold=0)
    assert external_files(path) == _onnx_locations(path)
    assert len(external_files(path)) == (1 if one_file else 2)
    add_sub(str(tmp_path), "simple", 8)  # weights inside the graph: none
    assert external_files(str(tmp_path / "simple" / "1" / "model.onnx")) == []
    (tmp_path / "bad.onnx").write_bytes(b"\x3a\x05\x5a\x10abc")
    with pytest.raises(ValueError):
        external_files(str(tmp_path / "bad.onnx"))
