"""Config completion for Python models: ``TritonPythonModel.auto_complete_config``.

Only a model.py that defines the hook pays for it (found by reading the file's
syntax tree, without running it); the hook then runs in a child process
(``conveyor.workers.backends.python.autocomplete``) so model code never runs in
the router; it runs on the router's repository agent (router/repository/agent.py), so
the router's loop never waits for it. As in Triton it runs whenever the model defines
it, and what the config file already says must agree with what the hook adds.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

from google.protobuf import json_format

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.model_config import from_json, to_json
from conveyor.proto.repository_files import read_bytes, unreadable

HOOK = "auto_complete_config"
TIMEOUT_S = 60.0


def defines_auto_complete(model_path: str) -> bool:
    """Whether model.py defines the hook; OSError when it cannot be read (never a FIFO's wait:
    proto/repository_files.py)."""
    try:
        tree = ast.parse(read_bytes(model_path), model_path)
    except (SyntaxError, ValueError):
        return False  # the worker's import reports the problem
    return any(
        isinstance(node, ast.ClassDef) and node.name == "TritonPythonModel"
        and any(isinstance(f, ast.FunctionDef) and f.name == HOOK for f in node.body)
        for node in tree.body
    )


def complete_python(config: mc.ModelConfig, model_path: str) -> str:
    """Let the model complete ``config`` in place; '' or the reason it could not."""
    try:
        if not defines_auto_complete(model_path):
            return ""
    except OSError as exc:
        return unreadable(model_path, exc)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "conveyor.workers.backends.python.autocomplete", model_path, str(os.getpid())],
            input=json.dumps(to_json(config)), capture_output=True, text=True, timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"auto_complete_config of '{model_path}' did not return within {TIMEOUT_S:.0f}s"
    if proc.returncode != 0:
        return proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit status {proc.returncode}"
    try:
        completed = from_json(json.loads(proc.stdout))
    except (ValueError, json_format.ParseError) as exc:
        return f"auto_complete_config of '{model_path}' returned a config Conveyor cannot read: {exc}"
    config.CopyFrom(completed)
    return ""
