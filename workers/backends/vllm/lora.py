"""Multi-LoRA: ``<version>/multi_lora.json`` names the adapters a request may pick with ``lora_name``."""

from __future__ import annotations

import json
import os
from typing import Any

from conveyor.proto.errors import invalid_arg, unavailable

FILENAME = "multi_lora.json"


class LoraRepository:
    """The adapters of one model, in file order (an adapter's engine id is its position + 1, as in Triton)."""

    def __init__(self, paths: dict[str, str], enabled: bool) -> None:
        self.paths = paths
        self.enabled = enabled
        self.names = list(paths)
        self._requests: dict[str, Any] = {}

    @classmethod
    def load(cls, version_dir: str, engine_args: dict[str, Any]) -> LoraRepository:
        """Read the adapters when ``model.json`` enables LoRA (``"enable_lora": true``, or "true")."""
        if str(engine_args.get("enable_lora", "false")).lower() != "true":
            return cls({}, False)
        path = os.path.join(version_dir, FILENAME)
        try:
            with open(path, encoding="utf-8") as f:
                paths = json.load(f)
        except FileNotFoundError:
            raise unavailable(f"Triton backend cannot find {path}.") from None
        except ValueError as exc:
            raise unavailable(f"'{path}' is not valid JSON: {exc}") from None
        if not isinstance(paths, dict) or not all(isinstance(v, str) for v in paths.values()):
            raise unavailable(f"'{path}' must map each adapter name to its local path")
        return cls({str(k): v for k, v in paths.items()}, True)

    def check(self, name: str) -> None:
        """INVALID_ARG for an adapter this model does not serve (Triton's wording)."""
        if not self.enabled:
            raise invalid_arg("LoRA feature is not enabled.")
        if name not in self.paths:
            raise invalid_arg(f"LoRA {name} is not supported, we currently support {self.names}")

    def request(self, name: str) -> Any:
        """The engine's ``LoRARequest`` for a checked adapter name (made once per adapter)."""
        found = self._requests.get(name)
        if found is None:
            from vllm.lora.request import LoRARequest

            lora_id = self.names.index(name) + 1
            found = self._requests[name] = LoRARequest(str(lora_id), lora_id, self.paths[name])
        return found
