"""SageMaker's ``POST /models`` picks the model of a repository by reading its models' configs, on the
SageMaker ingress's event loop: a ``config.pbtxt`` FIFO there held the loop (every SageMaker client)
for ever. It is passed over at once; the router's load then says what is wrong with it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.ingress.sagemaker.multi_model import model_location
from tests.support.fifos import Fifos, checked

LEVEL = "unit"

RELEASE_S = 20.0  # a bound, never a measure: released, the old code read an empty config instead


@pytest.fixture
def fifos() -> Iterator[Fifos]:
    yield from checked(RELEASE_S)


def test_a_config_fifo_is_passed_over(tmp_path: Path, fifos: Fifos) -> None:
    (tmp_path / "a_ensemble").mkdir()
    (tmp_path / "a_ensemble" / "config.pbtxt").write_text('name: "a_ensemble"\nplatform: "ensemble"\n')
    fifos.make(tmp_path / "b_model" / "config.pbtxt")
    # Without the FIFO read, the ensemble is the repository's model (not the last directory).
    assert model_location(str(tmp_path)) == (str(tmp_path), "a_ensemble")
    # A FIFO in place of the ensemble's config: passed over, the last directory chosen as with no ensemble.
    (tmp_path / "a_ensemble" / "config.pbtxt").unlink()
    fifos.make(tmp_path / "a_ensemble" / "config.pbtxt")
    assert model_location(str(tmp_path)) == (str(tmp_path), "b_model")
