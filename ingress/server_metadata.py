"""What the server says about itself (``GET /v2``, gRPC ServerMetadata)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# Clients feature-detect on these strings; list only what Conveyor implements.
EXTENSIONS = [
    "classification",
    "sequence",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "model_repository",
    "model_repository(unload_dependents)",
    "system_shared_memory",
    "cuda_shared_memory",
    "schedule_policy",
    "trace",
    "logging",
]

# tritonclient and tooling check the name; Conveyor answers as Triton does ("triton",
# or what --id says).
_server_name = "triton"


def set_server_name(name: str) -> None:
    """--id: the name server metadata reports (set once, before the ingress serves)."""
    global _server_name
    _server_name = name


def server_version() -> str:
    try:
        return version("conveyor")
    except PackageNotFoundError:
        return "0.0.0"


def server_metadata() -> dict[str, object]:
    return {"name": _server_name, "version": server_version(), "extensions": list(EXTENSIONS)}
