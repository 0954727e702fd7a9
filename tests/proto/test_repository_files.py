"""proto/repository_files.py against real entries where a repository's file belongs: a FIFO, a
socket, a directory, a device (through a link), a link to a regular file, a file far larger than
its bound, and a /proc file that reports no size. Nothing blocks: a FIFO is released after a bound
(``Fifos.releasing``) only so that a regression fails instead of hanging."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.proto.errors import ConveyorError
from conveyor.proto.lora import repository_adapters
from conveyor.proto.repository_files import (
    MAX_TEXT_BYTES,
    NotRegularFile,
    check_regular,
    check_tree,
    open_binary,
    read_bytes,
    read_text,
    unreadable,
)
from tests.support.fifos import Fifos, checked

LEVEL = "unit"

RELEASE_S = 20.0  # a bound, never a measure: a working reader refuses a FIFO without waiting on it


@pytest.fixture
def fifos() -> Iterator[Fifos]:
    yield from checked(RELEASE_S)


def refusal(call: object, *args: object, **kwargs: object) -> OSError:
    assert callable(call)
    with pytest.raises(OSError) as err:
        call(*args, **kwargs)
    return err.value


@pytest.mark.parametrize("reader", [read_bytes, read_text, check_regular, open_binary, check_tree])
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path, fifos: Fifos, reader: object) -> None:
    path = fifos.make(tmp_path / "config.pbtxt")
    exc = refusal(reader, path)
    assert isinstance(exc, NotRegularFile) and exc.errno == errno.EINVAL
    assert unreadable(path, exc) == f"failed to open text file for read {path}: a FIFO, not a regular file"


def test_other_kinds_are_refused(tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "sock"))
    try:
        assert refusal(read_bytes, tmp_path / "sock").strerror == "a socket, not a regular file"
    finally:
        sock.close()
    (tmp_path / "dir").mkdir()
    exc = refusal(read_bytes, tmp_path / "dir")
    assert (exc.errno, exc.strerror) == (errno.EISDIR, "a directory, not a regular file")
    check_regular(tmp_path / "dir", directory_ok=True)  # where a folder may stand (a SavedModel)
    (tmp_path / "zero").symlink_to("/dev/zero")  # endless: read whole, it would take all memory
    assert refusal(read_bytes, tmp_path / "zero").strerror == "a character device, not a regular file"
    assert isinstance(refusal(read_bytes, tmp_path / "none"), FileNotFoundError)


def test_a_link_to_a_regular_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "store.bin").write_bytes(b"weights")
    (tmp_path / "model.onnx").symlink_to(tmp_path / "store.bin")  # as Hugging Face's cache links its files
    assert read_bytes(tmp_path / "model.onnx") == b"weights"
    with open_binary(tmp_path / "model.onnx") as f:
        f.seek(3)
        assert f.read() == b"ghts"


def test_a_file_past_its_bound_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "config.pbtxt"
    with open(big, "wb") as f:
        f.truncate(8 << 30)  # sparse: 8 GiB that take no disk
    exc = refusal(read_text, big)
    assert exc.errno == errno.EFBIG
    assert exc.strerror == f"{8 << 30} bytes, more than the {MAX_TEXT_BYTES} a file of its kind may hold"
    small = tmp_path / "small"
    small.write_bytes(b"x" * 10)
    assert read_bytes(small, limit=10) == b"x" * 10
    assert refusal(read_bytes, small, limit=9).errno == errno.EFBIG


def test_a_file_that_reports_no_size_is_read_to_its_end() -> None:
    assert b"Name:" in read_bytes("/proc/self/status")  # a regular file of size 0


def test_a_tree_with_a_fifo_inside_is_refused(tmp_path: Path, fifos: Fifos) -> None:
    (tmp_path / "model.savedmodel" / "variables").mkdir(parents=True)
    (tmp_path / "model.savedmodel" / "saved_model.pb").write_bytes(b"")
    (tmp_path / "model.savedmodel" / "loop").symlink_to(tmp_path / "model.savedmodel")  # walked once
    check_tree(tmp_path / "model.savedmodel")
    fifos.make(tmp_path / "model.savedmodel" / "variables" / "variables.index")
    exc = refusal(check_tree, tmp_path / "model.savedmodel")
    assert exc.strerror == "variables/variables.index is a FIFO, not a regular file"


def test_a_multi_lora_fifo_is_refused(tmp_path: Path, fifos: Fifos) -> None:
    path = fifos.make(tmp_path / "multi_lora.json")
    with pytest.raises(ConveyorError) as err:
        repository_adapters(str(tmp_path))
    assert err.value.message == unreadable(path, NotRegularFile(errno.EINVAL, "a FIFO, not a regular file"))
