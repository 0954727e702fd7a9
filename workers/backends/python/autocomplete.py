"""Runs a Python model's ``auto_complete_config`` in a process of its own.

    python -m conveyor.workers.backends.python.autocomplete MODEL_PY [PARENT_PID] < config.json > completed.json

The router owns model configs but never imports model code (a model.py may pull
in torch, or hang): it runs this for each model.py that defines
``auto_complete_config``, as Triton runs it in a short-lived stub process.
Exit status 0 with the completed config as JSON on stdout, or 1 with the reason
on stderr. With ``PARENT_PID`` (the router's) it dies with that process: the router waits
for it on a thread of its own, and may stop meanwhile.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

from conveyor.proto.errors import ConveyorError
from conveyor.workers.backends.python.model_import import import_model_class
from conveyor.workers.backends.python.pb_utils import ModelConfig


def complete(model_path: str, config_json: str) -> str:
    model_class = import_model_class(model_path, "autocomplete")
    hook = getattr(model_class, "auto_complete_config", None)
    if hook is None:
        return config_json
    config = ModelConfig(config_json)
    completed = hook(config)
    if not isinstance(completed, ModelConfig):  # Triton's words (pb_stub.cc)
        raise TypeError(f"auto_complete_config function in model '{config._name}' must return a valid "
                        "pb.ModelConfig object.")
    return json.dumps(completed.as_dict())


_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """SIGKILL when the thread that started this process ends, as it does when the router exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the router's timeout still bounds this process
        return
    if os.getppid() != parent:  # the router went before that took effect
        os._exit(1)


def main() -> int:
    if len(sys.argv) > 2:
        _die_with(int(sys.argv[2]))
    result = sys.stdout
    sys.stdout = sys.stderr  # what the model prints must not mix with the JSON answer
    try:
        completed = complete(sys.argv[1], sys.stdin.read())
    except ConveyorError as exc:
        return _fail(exc.message)
    except Exception as exc:
        return _fail(f"auto_complete_config failed: {type(exc).__name__}: {exc}")
    result.write(completed)
    return 0


def _fail(reason: str) -> int:
    # One line, written last: the router reports the last line of stderr.
    sys.stderr.write("\n" + " ".join(reason.split()) + "\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
