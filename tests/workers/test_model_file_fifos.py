"""What a worker reads of a model when it loads one, each a FIFO in turn: label files, warm-up and
initial-state data, and a Python model's file (the framework backends' model files:
test_model_file_fifos_frameworks.py; a SavedModel holding a FIFO is refused by ``check_tree``, tested with the
helper). A blocking open would hold the instance's thread for ever, and the model would stay
LOADING; each is refused at once as UNAVAILABLE in Triton's words. The FIFO is released after a
bound only so that a regression fails instead of hanging."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.proto.errors import Status
from conveyor.workers.classification import load_labels
from conveyor.workers.sequence_state import SequenceSlots
from conveyor.workers.warmup import sample_inputs
from tests.support.fifos import FIFO, Fifos, checked, config, refused, unreadable

LEVEL = "unit"

RELEASE_S = 20.0  # a bound, never a measure
@pytest.fixture
def fifos() -> Iterator[Fifos]:
    yield from checked(RELEASE_S)


def test_a_label_file_fifo(tmp_path: Path, fifos: Fifos) -> None:
    labels = fifos.make(tmp_path / "labels.txt")
    cfg = config('output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] label_filename: "labels.txt" } ]')
    error = refused(lambda: load_labels(str(tmp_path), cfg))
    assert (error.status, error.message) == (Status.UNAVAILABLE, unreadable(labels))


def test_warmup_and_initial_state_data_fifos(tmp_path: Path, fifos: Fifos) -> None:
    fifos.make(tmp_path / "warmup" / "raw")
    cfg = config('max_batch_size: 1 model_warmup [ { name: "w" batch_size: 1 inputs { key: "X" value: { '
                 'data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "raw" } } } ]')
    error = refused(lambda: sample_inputs(cfg.model_warmup[0], cfg, str(tmp_path)))
    assert error.message.startswith("unable to read warmup data file '") and error.message.endswith(f": {FIFO}")
    fifos.make(tmp_path / "initial_state" / "state.bin")
    seq = config("""max_batch_size: 1 sequence_batching { state [ { input_name: "IN_STATE" output_name: "OUT_STATE"
      data_type: TYPE_FP32 dims: [ 2 ] initial_state [ { name: "s" data_type: TYPE_FP32 dims: [ 2 ]
      data_file: "state.bin" } ] } ] }""")
    error = refused(lambda: SequenceSlots(seq, str(tmp_path)))
    assert error.status is Status.UNAVAILABLE and error.message.endswith(FIFO), error.message


def test_a_python_model_file_fifo(tmp_path: Path, fifos: Fifos) -> None:
    from conveyor.workers.backends.python.model_import import _ModelLoader, import_model_class

    model_py = fifos.make(tmp_path / "1" / "model.py")
    error = refused(lambda: import_model_class(model_py, "m_1_0"))
    assert (error.status, error.message) == (Status.UNAVAILABLE, unreadable(model_py))
    # The import reads the file through its own loader: a name swapped for a FIFO after the check is refused too.
    with pytest.raises(OSError, match=FIFO):
        _ModelLoader("m", model_py).get_data(model_py)
