"""One model directory as the repository scan found it (``router/repository/scan.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.proto import model_config_pb2 as mc


@dataclass
class ModelSpec:
    """One model directory as found on disk."""

    name: str
    path: str
    config: mc.ModelConfig = field(default_factory=mc.ModelConfig)
    backend: str = ""
    versions: dict[int, str] = field(default_factory=dict)  # version -> model file path
    version_errors: dict[int, str] = field(default_factory=dict)
    error: str = ""
    # The error is one Triton finds while polling the repository (the config cannot be read, parsed or
    # validated, or names another model): such a model is never added (its name "is not found"), one that
    # serves keeps serving; other errors fail its load (the model is there, with no version available).
    poll_failed: bool = False
    # Its registry key where that is not its name: with --model-namespacing, a name held by
    # several repositories is keyed by its directory (router/spec/namespaces.py).
    key: str = ""

    @property
    def registry_key(self) -> str:
        return self.key or self.name
