"""What the server says about itself (``GET /v2``, gRPC ServerMetadata)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# Clients feature-detect on these strings; list only what Conveyor implements.
EXTENSIONS = [
    "classification",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "model_repository",
    "system_shared_memory",
    "cuda_shared_memory",
    "schedule_policy",
    "trace",
    "logging",
]

# tritonclient and tooling check the name; Conveyor answers as Triton does.
SERVER_NAME = "triton"


def server_version() -> str:
    try:
        return version("conveyor")
    except PackageNotFoundError:
        return "0.0.0"


def server_metadata() -> dict[str, object]:
    return {"name": SERVER_NAME, "version": server_version(), "extensions": list(EXTENSIONS)}
