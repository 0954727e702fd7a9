"""Multi-LoRA: the adapters a request may pick with ``lora_name``: the repository's
(``multi_lora.json`` and ``loras/<name>/``, ``proto/lora.py``) and those added at run time
(``/v1/load_lora_adapter``, through the router's ``LoraUpdate``)."""

from __future__ import annotations

import itertools
from typing import Any

from conveyor.proto.errors import invalid_arg, unavailable
from conveyor.proto.lora import FOLDER, MULTI_LORA, repository_adapters


class LoraRepository:
    """The adapters of one engine. A repository adapter's engine id is its position + 1, as in
    Triton; a runtime one takes the next free id, a new one each time it is added, so the engine
    never serves an adapter loaded again from another path with the weights it cached before."""

    def __init__(self, paths: dict[str, str], enabled: bool) -> None:
        self.paths = dict(paths)
        self.enabled = enabled
        self.repository = frozenset(paths)  # those a client may not replace or remove
        self._ids = dict(zip(paths, itertools.count(1)))
        self._next_id = itertools.count(len(paths) + 1)
        self._requests: dict[str, Any] = {}

    @classmethod
    def load(cls, version_dir: str, engine_args: dict[str, Any], runtime: bool = False) -> LoraRepository:
        """Read the adapters when ``model.json`` enables LoRA (``"enable_lora": true``, or "true");
        ``runtime``: adapters may come at run time, so the repository need not name any."""
        if str(engine_args.get("enable_lora", "false")).lower() != "true":
            return cls({}, False)
        paths = repository_adapters(version_dir)
        if paths is None and not runtime:
            raise unavailable(f"Triton backend cannot find {version_dir}/{MULTI_LORA} (or adapters in {FOLDER}/).")
        return cls(paths or {}, True)

    @property
    def names(self) -> list[str]:
        return list(self.paths)

    def check(self, name: str) -> None:
        """INVALID_ARG for an adapter this model does not serve (Triton's wording)."""
        if not self.enabled:
            raise invalid_arg("LoRA feature is not enabled.")
        if name not in self.paths:
            raise invalid_arg(f"LoRA {name} is not supported, we currently support {self.names}")

    def request(self, name: str) -> Any:
        """The engine's ``LoRARequest`` for a checked adapter name (made once per adapter). Its name is
        the adapter's, which the engine's ``vllm:lora_requests_info`` reports (Triton names it by id)."""
        found = self._requests.get(name)
        if found is None:
            from vllm.lora.request import LoRARequest

            found = self._requests[name] = LoRARequest(name, self._ids[name], self.paths[name])
        return found

    def add(self, name: str, path: str) -> Any:
        """A runtime adapter (replacing a runtime one of that name): its ``LoRARequest``."""
        if not self.enabled:
            raise invalid_arg("LoRA feature is not enabled: the model's model.json does not set "
                              "\"enable_lora\": true.")
        if name in self.repository:
            raise invalid_arg(f"The lora adapter '{name}' has already been loaded: it is in the model's repository.")
        self.paths[name] = path
        self._ids[name] = next(self._next_id)
        self._requests.pop(name, None)
        return self.request(name)

    def remove(self, name: str) -> int | None:
        """Forget a runtime adapter: its engine id, None when it is not one."""
        if name in self.repository or name not in self.paths:
            return None
        del self.paths[name]
        self._requests.pop(name, None)
        return self._ids.pop(name)
