"""A Python model's ``auto_complete_config`` runs in a child process that the router's
repository agent waits on (router/repository/python_autocomplete.py): the router may exit
meanwhile (its agent's threads do not hold it), and the child then dies with it instead of
running on for as long as the hook takes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.waiting import eventually

HANGS = """
import time


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        time.sleep(120)
        return config
"""

# The router in miniature: the completion on the repository agent, then the process exits.
ROUTER = """
import sys, time
from conveyor.proto import model_config_pb2 as mc
from conveyor.router.repository.agent import Lane, RepositoryAgent
from conveyor.router.repository.python_autocomplete import complete_python

agent = RepositoryAgent()
agent.submit(Lane.LOAD, lambda: complete_python(mc.ModelConfig(name="m"), sys.argv[1]), print)
time.sleep(float(sys.argv[2]))
"""


def _children_running(model_py: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if model_py.encode() in argv:
            found.append(int(pid))
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_the_completion_child_dies_with_the_router(tmp_path: Path) -> None:
    model_py = tmp_path / "m" / "1" / "model.py"
    model_py.parent.mkdir(parents=True)
    model_py.write_text(textwrap.dedent(HANGS))
    started = time.monotonic()
    router = subprocess.run([sys.executable, "-c", ROUTER, str(model_py), "2"], timeout=60, capture_output=True)
    assert router.returncode == 0, router.stderr
    assert time.monotonic() - started < 30, "the router waited for the completion to end"
    eventually(lambda: not _children_running(str(model_py)), timeout=10, what="the completion outlived the router")
