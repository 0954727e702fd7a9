"""Reading the model config (a dict parsed from ``args["model_config"]``) and
``pb_utils.ModelConfig``, what ``auto_complete_config`` receives and returns."""

from __future__ import annotations

import json
from typing import Any


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("input", []) if t.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("output", []) if t.get("name") == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


class ModelConfig:
    """The config being completed. As in Triton, only batching, inputs, outputs
    and the transaction policy can be changed, and only without contradicting
    what the config file already says."""

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        self._config: dict[str, Any] = (
            json.loads(model_config) if isinstance(model_config, str) else dict(model_config)
        )
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])
        self._config.setdefault("max_batch_size", 0)

    @property
    def _name(self) -> str:
        return str(self._config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function "
                f"for model '{self._name}' specified max_batch_size {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if self._config.get(other):
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but auto-complete-config function "
                    f"for model '{self._name}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # Triton names the parameter "input"
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        unknown = set(transaction_policy_dict) - {"decoupled"}
        if unknown:
            raise ValueError(
                f"model transaction property in auto-complete-config function for model '{self._name}' "
                "contains property other than 'decoupled'."
            )
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{self._name}', "
                    f"which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted

    def _add(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        extra = set(tensor) - set(allowed)
        if extra:  # Triton's words (triton_python_backend_utils.py): "'a', 'b' and 'c'"
            names = [repr(a) for a in allowed]
            raise ValueError(
                f"{kind} '{tensor.get('name')}' in auto-complete-config function for model '{self._name}' "
                f"contains property other than {', '.join(names[:-1])} and {names[-1]}."
            )
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model '{self._name}' is missing 'name' "
                             "property.")
        for required in ("data_type", "dims"):
            if required not in tensor:
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model "
                    f"'{self._name}' is missing '{required}' property."
                )
        name = tensor["name"]
        for current in self._config[kind]:
            if current.get("name") != name:
                continue
            declared_type = current.get("data_type", "TYPE_INVALID")
            if declared_type not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(
                    f"unable to load model '{self._name}', configuration expects datatype {declared_type} "
                    f"for {kind} '{name}', model provides {tensor['data_type']}"
                )
            if current.get("dims") and list(current["dims"]) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{self._name}', tensor '{name}': the model expects dims {list(tensor['dims'])} "
                    f"but the model configuration specifies dims {list(current['dims'])}"
                )
            current.update(tensor)
            return
        self._config[kind].append(dict(tensor))
