"""Whether and how a TorchScript model is compiled with ``torch.compile``: Conveyor's
parameters, read from a model config.

    parameters { key: "conveyor.torch_compile" value { string_value: "true" } }

* ``conveyor.torch_compile``: ``true`` compiles at load, and a failure fails the
  load; ``auto`` compiles at load, and on a failure serves the TorchScript module
  as it is, with a warning; ``false`` (the default) does not compile.
* ``conveyor.torch_compile_backend``: a registered torch.compile backend
  (default ``inductor``; ``aot_eager`` and ``eager`` need no C++ compiler).
* ``conveyor.torch_compile_mode``: one of inductor's modes (``default``,
  ``reduce-overhead``, ``max-autotune``, ...); inductor only.
* ``conveyor.torch_compile_dynamic``: ``true`` or ``false``; unset, torch's
  automatic dynamic shapes (static first, dynamic once a size changes).

``TORCH_COMPILE_OPTIONAL_PARAMETERS``, the JSON object Triton's model.py runtime
hands to torch.compile (``fullgraph``, ``dynamic``, ``backend``, ``mode``,
``options``, ``disable``), is read too, for the options: on its own it compiles
nothing, since Triton does not compile TorchScript models. A value both name
must agree.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_flag, parameter_text
from conveyor.proto.errors import invalid_arg

SWITCH = "conveyor.torch_compile"
BACKEND = "conveyor.torch_compile_backend"
MODE = "conveyor.torch_compile_mode"
DYNAMIC = "conveyor.torch_compile_dynamic"
TRITON_OPTIONS = "TORCH_COMPILE_OPTIONAL_PARAMETERS"

_WHEN = {"true": "on", "1": "on", "yes": "on", "on": "on", "auto": "auto",
         "false": "off", "0": "off", "no": "off", "off": "off"}
# Triton's keys, with the JSON type each must have.
_TRITON_KEYS: dict[str, type] = {"fullgraph": bool, "dynamic": bool, "backend": str, "mode": str,
                                 "options": dict, "disable": bool}
_JSON_NAMES = {bool: "boolean", str: "string", dict: "object"}


@dataclass(frozen=True, slots=True)
class CompileSettings:
    when: str = "off"  # "off", "on" (a failure fails the load) or "auto" (a failure serves uncompiled)
    backend: str = "inductor"
    mode: str | None = None
    dynamic: bool | None = None
    fullgraph: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.when != "off"

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> CompileSettings:
        """The settings; the values' form is checked here, names against torch by ``check``."""
        triton = _triton_options(config)
        text = parameter_text(config, SWITCH).lower()
        if text and text not in _WHEN:
            raise invalid_arg(f"parameter '{SWITCH}' must be true, false or auto, not '{text}'")
        when = _WHEN.get(text, "off")
        if triton.get("disable"):
            when = "off"  # torch.compile(disable=True) is a no-op: run the module as it is
        backend = _agreed(BACKEND, parameter_text(config, BACKEND) or None, triton.get("backend")) or "inductor"
        mode = _agreed(MODE, parameter_text(config, MODE) or None, triton.get("mode"))
        dynamic = _agreed(DYNAMIC, parameter_flag(config, DYNAMIC), triton.get("dynamic"))
        options = triton.get("options") or {}
        if mode is not None and options:
            raise invalid_arg(f"'{MODE}' and the options of '{TRITON_OPTIONS}' cannot both be given "
                              f"(torch.compile takes a mode or options)")
        return cls(when, backend, mode, dynamic, bool(triton.get("fullgraph")), options)

    def check(self, backends: Iterable[str], modes: Iterable[str]) -> None:
        """Refuse a backend or mode this torch does not have."""
        backends, modes = sorted(backends), sorted(modes)
        if self.backend not in backends:
            raise invalid_arg(f"parameter '{BACKEND}': torch.compile has no backend '{self.backend}' "
                              f"(it has {', '.join(b for b in backends if 'TESTING' not in b)})")
        if self.mode is not None:
            if self.backend != "inductor":
                raise invalid_arg(f"parameter '{MODE}' applies to the inductor backend only, "
                                  f"not '{self.backend}'")
            if self.mode not in modes:
                raise invalid_arg(f"parameter '{MODE}' must be one of {', '.join(modes)}, not '{self.mode}'")


def _triton_options(config: mc.ModelConfig) -> dict[str, Any]:
    text = parameter_text(config, TRITON_OPTIONS)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise invalid_arg(f"parameter '{TRITON_OPTIONS}' must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise invalid_arg(f"parameter '{TRITON_OPTIONS}' must be a JSON object, not {text!r}")
    value = {k: v for k, v in value.items() if v is not None}  # null: torch.compile's default
    for key, item in value.items():
        kind = _TRITON_KEYS.get(key)
        if kind is None:
            raise invalid_arg(f"parameter '{TRITON_OPTIONS}': torch.compile takes no '{key}' "
                              f"(it takes {', '.join(_TRITON_KEYS)})")
        if not isinstance(item, kind):
            raise invalid_arg(f"parameter '{TRITON_OPTIONS}': '{key}' must be a JSON {_JSON_NAMES[kind]}, "
                              f"not {json.dumps(item)}")
    return value


def _agreed(key: str, ours: Any, triton: Any) -> Any:
    if ours is not None and triton is not None and ours != triton:
        raise invalid_arg(f"parameter '{key}' ({ours}) and '{TRITON_OPTIONS}' ({triton}) disagree")
    return ours if ours is not None else triton
