"""FIFOs made where a model repository's files belong, as anyone who can write there could, all
removed again by ``cleanup``.

``release`` opens every FIFO for writing without blocking and closes it: a reader stuck in a
blocking open of one (the bug these FIFOs attack) reads an end of file and comes back, so a test of
a reverted fix fails instead of hanging, and the server can stop. ``waited`` counts the readers it
found waiting so: none, where nothing blocks on a FIFO. ``releasing`` releases every so often from a
thread, for calls that would otherwise never return.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError

FIFO = "a FIFO, not a regular file"  # the reason in a refusal's words


def unreadable(path: str | Path) -> str:
    """A refusal of a FIFO where a text file belongs, in Triton's words."""
    return f"failed to open text file for read {path}: {FIFO}"


def config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def refused(call: Callable[[], Any]) -> ConveyorError:
    with pytest.raises(ConveyorError) as err:
        call()
    return err.value


class Fifos:
    def __init__(self) -> None:
        self._made: list[str] = []
        self.waited = 0  # readers found waiting in a blocking open (a write-only open finds one)

    def make(self, path: str | os.PathLike[str]) -> str:
        """A FIFO at ``path`` (its folder made); its path."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkfifo(path, 0o644)
        self._made.append(path)
        return path

    def release(self) -> None:
        for path in self._made:
            with contextlib.suppress(OSError):  # ENXIO unless a reader waits; gone already
                if stat.S_ISFIFO(os.lstat(path).st_mode):
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                    self.waited += 1

    @contextlib.contextmanager
    def releasing(self, every_s: float) -> Iterator[None]:
        """``release`` each time ``every_s`` passes inside the block (a bound, never a measure)."""
        done = threading.Event()

        def loop() -> None:
            while not done.wait(every_s):
                self.release()

        thread = threading.Thread(target=loop, name="fifo-release", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def left(self) -> list[str]:
        """The FIFOs of ours still on disk."""
        return [p for p in self._made if os.path.lexists(p)]

    def cleanup(self) -> None:
        self.release()
        for path in self._made:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def __enter__(self) -> Fifos:
        return self

    def __exit__(self, *_: Any) -> None:
        self.cleanup()


def checked(release_s: float) -> Iterator[Fifos]:
    """A test's FIFOs (a fixture's body: ``yield from checked(...)``), released every ``release_s`` while it
    runs; after it, none left and no reader ever found waiting on one."""
    with Fifos() as made, made.releasing(release_s):
        yield made
    assert made.left() == []
    assert made.waited == 0  # nothing ever waited in a blocking open of one
