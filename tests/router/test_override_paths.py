"""The repository load API's file overrides and a client's config, without a group: a load's files are
written inside its own private folder only, and the files a client's config names lie in the model's
directory. Against a group: tests/e2e/test_attack_paths.py."""

from __future__ import annotations

import os
import tempfile

import pytest

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.lifecycle.calls import check_override_files
from conveyor.router.repository.prepare import override_root, write_override

LEVEL = "unit"


@pytest.fixture
def private_tmp(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return str(tmp_path)


@pytest.mark.parametrize("key", ["../x", "1/../../x", "/../x", "x/../1/y", "1/a\0b", "1/" + "e" * 300, "model.py"])
def test_an_override_that_leaves_its_folder_is_refused(private_tmp: str, key: str) -> None:
    with pytest.raises(ConveyorError, match="failed to poll from model repository"):
        write_override("m", {"1/model.py": b"ok", key: b"payload"})
    assert os.listdir(override_root()) == []  # the refused load's folder is gone
    assert sorted(os.listdir(private_tmp)) == [os.path.basename(override_root())]


def test_overrides_are_written_in_a_private_folder(private_tmp: str) -> None:
    folder = write_override("m", {"/1/model.py": b"ok", "2/sub/f.txt": b"x"})
    assert os.path.dirname(folder) == override_root()
    with open(os.path.join(folder, "1", "model.py"), "rb") as f:
        assert f.read() == b"ok"
    assert os.stat(override_root()).st_mode & 0o777 == 0o700


@pytest.mark.parametrize("state", ["link", "open"])
def test_an_overrides_folder_others_could_change_is_not_used(private_tmp: str, state: str) -> None:
    elsewhere = os.path.join(private_tmp, "elsewhere")
    os.mkdir(elsewhere)
    root = os.path.join(private_tmp, os.path.basename(override_root()))
    os.rmdir(root)
    if state == "link":
        os.symlink(elsewhere, root)
    else:
        os.mkdir(root)
        os.chmod(root, 0o777)
    with pytest.raises(ConveyorError, match="failed to poll from model repository"):
        write_override("m", {"1/model.py": b"ok"})
    assert os.listdir(elsewhere) == []


def _config(text: str) -> mc.ModelConfig:
    from conveyor.proto.model_config import parse_text

    return parse_text('name: "m"\n' + text)


@pytest.mark.parametrize("text", [
    'output [ { name: "o" data_type: TYPE_FP32 dims: [1] label_filename: "/etc/passwd" } ]',
    'output [ { name: "o" data_type: TYPE_FP32 dims: [1] label_filename: "../../secret" } ]',
    'default_model_filename: "../../../evil.py"',
    'cc_model_filenames { key: "8.0" value: "/abs/model.plan" }',
    'model_warmup [ { name: "w" batch_size: 1 inputs { key: "i" value: { data_type: TYPE_FP32 dims: [1] '
    'input_data_file: "/dev/zero" } } } ]',
    'sequence_batching { state [ { input_name: "s" output_name: "t" data_type: TYPE_FP32 dims: [1] '
    'initial_state [ { data_type: TYPE_FP32 dims: [1] data_file: "../../../dev/zero" } ] } ] }',
])
def test_a_config_naming_a_file_outside_the_model_is_refused(text: str) -> None:
    with pytest.raises(ConveyorError) as err:
        check_override_files("m", _config(text))
    assert err.value.status is Status.INVALID_ARG
    assert "must name a file inside the model's directory" in err.value.message


def test_files_inside_the_model_are_fine() -> None:
    check_override_files("m", _config(
        'default_model_filename: "model.py" output [ { name: "o" data_type: TYPE_FP32 dims: [1] '
        'label_filename: "labels/../labels.txt" } ]'))
