"""A config.pbtxt whose integer field holds what it cannot take: under tritonserver's (Triton's) log format the
server's output has the line Triton's C++ protobuf parser writes, in its words (qa/L0_simple_ensemble greps them);
under Conveyor's log format only the load failure says it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.deploy.runtime.log_settings import LogSettings, ProcessLog
from conveyor.router.repository.scan import load_spec

LEVEL = "unit"

CONFIG = '''name: "ens"
platform: "ensemble"
max_batch_size: 8
ensemble_scheduling {
  max_inflight_requests: VALUE
  step [ { model_name: "m" model_version: -1 } ]
}
'''

# qa/L0_simple_ensemble's invalid values and the words test.sh greps for each; and a signed field's.
CASES = [
    ("max_inflight_requests: -5", "5:26: Expected integer, got: -"),
    ('max_inflight_requests: "invalid_value"', '5:26: Expected integer, got: "invalid_value"'),
    ("max_inflight_requests: 12345678901", "5:26: Integer out of range (12345678901)"),
    ("max_inflight_requests: 1.5", "5:26: Expected integer, got: 1.5"),
]


@pytest.fixture
def triton_format() -> Iterator[None]:
    before = ProcessLog.settings
    ProcessLog.settings = LogSettings(log_format="default")
    yield
    ProcessLog.settings = before


def write(tmp_path: Path, line: str) -> str:
    (tmp_path / "ens").mkdir()
    (tmp_path / "ens" / "config.pbtxt").write_text(CONFIG.replace("max_inflight_requests: VALUE", line))
    return str(tmp_path / "ens")


@pytest.mark.parametrize(("line", "words"), CASES)
def test_cpp_protobufs_words_under_tritons_log_format(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       triton_format: None, line: str, words: str) -> None:
    spec = load_spec("ens", write(tmp_path, line))
    assert spec.error and "failed to parse" in spec.error
    err = capsys.readouterr().err
    assert f"] Error parsing text-format inference.ModelConfig: {words}\n" in err
    assert err.startswith("[libprotobuf ERROR ")


def test_a_signed_field_out_of_range(tmp_path: Path, capsys: pytest.CaptureFixture[str], triton_format: None) -> None:
    spec = load_spec("ens", write(tmp_path, "max_inflight_requests: 1\n}\nmax_batch_size: -5000000000\n#"))
    assert spec.error
    assert "Error parsing text-format inference.ModelConfig: 7:18: Integer out of range (5000000000)" in \
        capsys.readouterr().err


def test_nothing_extra_under_conveyors_log_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = load_spec("ens", write(tmp_path, "max_inflight_requests: -5"))
    assert "Value out of range: -5" in spec.error
    assert "libprotobuf" not in capsys.readouterr().err
