"""A Python model's ``auto_complete_config`` runs in a child process that the router's
repository agent waits on (router/repository/python_autocomplete.py): the config it completes, the
conflict it finds as the model's reason, a model.py without config.pbtxt completed; and the router may exit
meanwhile (its agent's threads do not hold it), and the child then dies with it instead of running on for as
long as the hook takes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conveyor.deploy.example_repo import write_model
from conveyor.router.repository.scan import load_spec
from tests.support import python_models
from tests.support.waiting import eventually

LEVEL = "e2e"

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


def test_auto_complete_config_runs_outside_the_router(tmp_path: Path) -> None:
    python_models.write_model(str(tmp_path), "auto", python_models.AUTOCOMPLETE_MODEL,
                              'name: "auto"\nbackend: "python"\n')
    spec = load_spec("auto", str(tmp_path / "auto"))
    assert not spec.error, spec.error
    assert spec.config.max_batch_size == 4 and spec.config.HasField("dynamic_batching")
    assert [(t.name, list(t.dims)) for t in spec.config.input] == [("INPUT0", [3])]
    assert not [m for m in sys.modules if m.startswith("_conveyor_model_autocomplete")]  # ran in a child process


def test_auto_complete_config_conflict_is_the_reason(tmp_path: Path) -> None:
    config = 'name: "auto"\nbackend: "python"\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
    python_models.write_model(str(tmp_path), "auto", python_models.AUTOCOMPLETE_MODEL, config)
    spec = load_spec("auto", str(tmp_path / "auto"))
    assert "configuration expects datatype TYPE_FP32 for input 'INPUT0', model provides TYPE_INT64" in spec.error


def test_a_model_py_without_config_pbtxt_is_completed(tmp_path: Path) -> None:
    """As Triton (L0_backend_python's auto_complete_error model has no config.pbtxt): a model
    directory holding <version>/model.py is a Python model whose config auto_complete_config makes."""
    write_model(tmp_path, "bare", None, {"model.py": textwrap.dedent(python_models.AUTOCOMPLETE_MODEL)})
    spec = load_spec("bare", str(tmp_path / "bare"))
    assert not spec.error, spec.error
    assert spec.config.backend == "python" and [t.name for t in spec.config.input] == ["INPUT0"]
    broken = ("class TritonPythonModel:\n    @staticmethod\n"
              "    def auto_complete_config(c):\n        return nothing_here\n")
    write_model(tmp_path, "broken", None, {"model.py": broken})
    assert "name 'nothing_here' is not defined" in load_spec("broken", str(tmp_path / "broken")).error
