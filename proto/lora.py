"""A vLLM model's LoRA adapters as its repository holds them, and the parameter that lets clients
add more at run time: read alike by the worker (which gives them to the engine), the ingress (which
lists them on ``/v1/models``) and the router (which refuses runtime loads a model does not allow).

Two places name a version's adapters, both in ``<model>/<version>/`` (docs/LLM.md):

* ``multi_lora.json``, Triton's: ``{"name": "/path/to/adapter", ...}``;
* ``loras/<name>/``, Conveyor's: each folder an adapter (PEFT's ``adapter_config.json`` and weights),
  named by its folder, found without any list to keep up to date.

Both may be used; a name in both must be the same folder. ``multi_lora.json``'s come first, then the
folders in name order: an adapter's position gives its engine id, as in Triton.
"""

from __future__ import annotations

import json
import os

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_flag
from conveyor.proto.errors import unavailable
from conveyor.proto.repository_files import read_text, unreadable

MULTI_LORA = "multi_lora.json"
FOLDER = "loras"
# vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING, as a parameter of the model's config.pbtxt: per model, and
# kept with the repository rather than in every process's environment.
RUNTIME_PARAMETER = "ALLOW_RUNTIME_LORA_UPDATING"


def runtime_updates_allowed(config: mc.ModelConfig) -> bool:
    """Whether clients may load and unload this model's adapters at run time (off unless set)."""
    return bool(parameter_flag(config, RUNTIME_PARAMETER))


def repository_adapters(version_dir: str) -> dict[str, str] | None:
    """The version's adapters, name -> path; None when it has neither ``multi_lora.json`` nor
    ``loras/``. UNAVAILABLE (the model does not load) for a list that is not one."""
    listed = _multi_lora(os.path.join(version_dir, MULTI_LORA))
    folders = _folders(os.path.join(version_dir, FOLDER))
    if listed is None and folders is None:
        return None
    adapters = dict(listed or {})
    for name, path in (folders or {}).items():
        known = adapters.setdefault(name, path)
        if os.path.realpath(known) != os.path.realpath(path):
            raise unavailable(f"LoRA adapter '{name}' is both in {MULTI_LORA} ('{known}') and in "
                              f"{FOLDER}/ ('{path}'): give it one place")
    return adapters


def _multi_lora(path: str) -> dict[str, str] | None:
    try:
        doc = json.loads(read_text(path))  # never a FIFO's wait (proto/repository_files.py)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise unavailable(unreadable(path, exc)) from None
    except ValueError as exc:
        raise unavailable(f"'{path}' is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        raise unavailable(f"'{path}' must map each adapter name to its local path")
    return {str(k): v for k, v in doc.items()}


def _folders(path: str) -> dict[str, str] | None:
    try:
        names = sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise unavailable(f"cannot list the LoRA adapters in '{path}': {exc}") from None
    return {name: os.path.join(path, name) for name in names
            if not name.startswith(".") and os.path.isdir(os.path.join(path, name))}
