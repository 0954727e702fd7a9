"""The LoRA adapters clients loaded at run time (``/v1/load_lora_adapter``), by name: which model
each belongs to and where its weights are. The router keeps them so that every instance of the
model that loads later (a worker restarted, a reload, another replica placed) is given them too.

Names are server-wide, as on vLLM's server, where a request's ``model`` names a base model or an
adapter alike: no adapter shares its name with a model or another adapter. The checks and their
wording are vLLM's (``vllm/entrypoints/openai/models/serving.py``); a failed check is a value with a
status, rendered once by the ingress.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from conveyor.proto.errors import ConveyorError, Status, invalid_arg, not_found


@dataclass
class Adapter:
    name: str
    model: str
    path: str
    loaded: bool = False  # every instance has it; False while its load is under way


class AdapterBook:
    def __init__(self) -> None:
        self.adapters: dict[str, Adapter] = {}

    def check_load(self, name: str, path: str, model: str, inplace: bool, models: Container[str]) -> None:
        """Whether ``name`` may be loaded from ``path`` for ``model`` now (``models``: the names served)."""
        if not name or not path:
            raise invalid_arg("Both 'lora_name' and 'lora_path' must be provided.")
        if name in models:
            raise invalid_arg(f"The lora adapter '{name}' conflicts with a served base model.")
        known = self.adapters.get(name)
        if known is None:
            return
        if not known.loaded:
            raise ConveyorError(Status.UNAVAILABLE, f"The lora adapter '{name}' is being loaded: try again "
                                                    "once that load is answered.")
        if not inplace:
            raise invalid_arg(f"The lora adapter '{name}' has already been loaded. If you want to load the "
                              "adapter in place, set 'load_inplace' to True.")
        if known.model != model:
            raise invalid_arg(f"The lora adapter '{name}' has already been loaded for model '{known.model}'.")

    def begin(self, name: str, model: str, path: str) -> Adapter | None:
        """A checked load under way; the adapter it replaces (in place), if any."""
        previous = self.adapters.get(name)
        self.adapters[name] = Adapter(name, model, path)
        return previous

    def confirm(self, name: str) -> None:
        self.adapters[name].loaded = True

    def restore(self, name: str, previous: Adapter | None) -> None:
        """A load that failed: what was there before it (nothing, or the adapter it was to replace)."""
        if previous is None:
            self.adapters.pop(name, None)
        else:
            self.adapters[name] = previous

    def check_unload(self, name: str) -> Adapter:
        if not name:
            raise invalid_arg("'lora_name' needs to be provided to unload a LoRA adapter.")
        known = self.adapters.get(name)
        if known is None:
            raise not_found(f"The lora adapter '{name}' cannot be found.")
        if not known.loaded:
            raise ConveyorError(Status.UNAVAILABLE, f"The lora adapter '{name}' is being loaded: try again "
                                                    "once that load is answered.")
        return known

    def remove(self, name: str) -> Adapter:
        """``check_unload``, then forget it."""
        known = self.check_unload(name)
        del self.adapters[name]
        return known

    def of_model(self, model: str) -> list[Adapter]:
        """The model's adapters, those being loaded included (an instance that loads meanwhile gets it too)."""
        return [a for a in self.adapters.values() if a.model == model]

    def listing(self) -> dict[str, dict[str, str]]:
        """The loaded adapters, name -> {"model", "path"} (the OpenAI ingress's ``/v1/models``)."""
        return {a.name: {"model": a.model, "path": a.path} for a in self.adapters.values() if a.loaded}
