"""What the repository scan needs to know about the framework backends (``fil``, ``openvino``,
``tensorflow``): their Triton platform/backend names, default model files, and config completion.

Kept apart from ``scan.py`` (which merges these tables into its own) so each backend's rules sit
in one place. Completion reads the model with its framework, in a child process
(``python -m conveyor.workers.backends.<backend>.autocomplete``), so the router never imports
OpenVINO or TensorFlow: a framework that is not installed makes that model UNAVAILABLE with the
extra to install, and a model file that hangs or crashes its reader costs only the child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from google.protobuf import json_format

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.fil_model_files import default_model_file
from conveyor.proto.model_config import from_json, to_json
from conveyor.proto.repository_files import check_regular, unreadable

# Triton's platform / backend names -> the worker backend.
BACKENDS = {
    "fil": "fil",
    "openvino": "openvino",
    "tensorflow": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}
# Model files Triton recognises a backend by when the config names none.
MODEL_FILE_BACKEND = {".savedmodel": "tensorflow", ".graphdef": "tensorflow"}
_TF_FILES = {"tensorflow_savedmodel": "model.savedmodel", "tensorflow_graphdef": "model.graphdef"}
# Why a config without inputs/outputs cannot be completed.
NOT_COMPLETED = {
    "fil": "a FIL model's config must declare input__0 and output__0, as in Triton",
    "tensorflow": "a GraphDef has no signature to complete the config from, and a SavedModel's is read only "
                  "without --strict-model-config: declare the inputs and outputs",
}
COMPLETED = ("openvino", "tensorflow")  # backends whose configs are completed from the model
TIMEOUT_S = 120.0  # TensorFlow's import alone takes seconds on a busy host


def default_filename(config: mc.ModelConfig) -> str:
    """The version's model file for these backends ('' for other backends)."""
    if config.backend == "fil":
        return default_model_file(config)
    if config.backend == "openvino":
        return "model.xml"
    if config.backend == "tensorflow":
        return _TF_FILES.get(config.platform, "model.savedmodel")
    return ""


def tensorflow_platform(path: str) -> str:
    """Triton's platform for ``backend: "tensorflow"`` without one, from the version directories'
    files: a GraphDef only where no SavedModel is."""
    for entry in sorted(os.listdir(path), reverse=True):
        version = os.path.join(path, entry)
        if entry.isdigit() and os.path.isdir(version):
            if os.path.exists(os.path.join(version, "model.graphdef")) and not os.path.exists(
                    os.path.join(version, "model.savedmodel")):
                return "tensorflow_graphdef"
            if os.path.exists(os.path.join(version, "model.savedmodel")):
                return "tensorflow_savedmodel"
    return "tensorflow_savedmodel"


def complete(backend: str, config: mc.ModelConfig, model_path: str, max_batch_size_given: bool,
             default_max_batch_size: int) -> str:
    """Complete ``config`` in place from the model file; '' or the reason it could not."""
    if backend == "tensorflow" and config.platform == "tensorflow_graphdef":
        return ""  # nothing to read: validate() then says what is missing, with NOT_COMPLETED's reason
    try:  # the child opens it again: a file swapped in meanwhile costs it TIMEOUT_S at most
        check_regular(model_path, directory_ok=True)
    except OSError as exc:
        return unreadable(model_path, exc)
    request = {"config": to_json(config), "model_path": model_path,
               "max_batch_size_given": max_batch_size_given, "default_max_batch_size": default_max_batch_size}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", f"conveyor.workers.backends.{backend}.autocomplete"],
            input=json.dumps(request), capture_output=True, text=True, timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"reading '{model_path}' to complete its config did not finish within {TIMEOUT_S:.0f}s"
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return lines[-1] if lines else f"completing the config from '{model_path}' failed ({proc.returncode})"
    try:
        completed = from_json(json.loads(proc.stdout))
    except (ValueError, json_format.ParseError) as exc:
        return f"the config completed from '{model_path}' cannot be read: {exc}"
    config.CopyFrom(completed)
    return ""
