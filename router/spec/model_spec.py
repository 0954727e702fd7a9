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
    # Its registry key where that is not its name: with --model-namespacing, a name held by
    # several repositories is keyed by its directory (router/spec/namespaces.py).
    key: str = ""

    @property
    def registry_key(self) -> str:
        return self.key or self.name
