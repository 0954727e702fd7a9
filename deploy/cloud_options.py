"""Triton's SageMaker and Vertex AI endpoints: the checks on their flags (declared in
``deploy/settings.py``), and the ``AIP_*`` environment Vertex AI sets.

``AIP_MODE=PREDICTION`` turns the Vertex AI endpoint on and the HTTP and gRPC ones
off by default; ``AIP_HTTP_PORT`` is ``--vertex-ai-port``'s default; ``AIP_STORAGE_URI``
is the model repository when none is given; ``AIP_PREDICT_ROUTE`` and
``AIP_HEALTH_ROUTE`` are the endpoint's routes (both required). As Triton's
command_line_parser.cc.
"""

from __future__ import annotations

import argparse
import os

from conveyor.deploy.settings import ServeSettings

SAGEMAKER_INFERENCE_TYPE_ENV = "SAGEMAKER_TRITON_INFERENCE_TYPE"
SAGEMAKER_INFERENCE_TYPES = ("infer", "generate", "generate_stream")  # what /invocations maps to


def fold_storage_uri(a: argparse.Namespace) -> None:
    """No --model-repository: AIP_STORAGE_URI is the repository, as in Triton."""
    uri = os.environ.get("AIP_STORAGE_URI", "")
    if not a.model_repository and uri:
        a.model_repository = [uri]


def check_cloud_args(a: ServeSettings) -> str:
    """Why the endpoints cannot start as asked (Triton's words), or ''."""
    if a.allow_vertex_ai:
        if not os.environ.get("AIP_PREDICT_ROUTE"):
            return "API_PREDICT_ROUTE is not defined for Vertex AI endpoint"
        if not os.environ.get("AIP_HEALTH_ROUTE"):
            return "AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint"
    if a.allow_sagemaker and (problem := check_inference_type(os.environ.get(SAGEMAKER_INFERENCE_TYPE_ENV))):
        return problem
    sagemaker_range = a.sagemaker_safe_port_range if a.allow_sagemaker else None
    services: list[tuple[str, str, int, tuple[int, int] | None]] = []
    if a.allow_http:
        services.append(("HTTP", a.http_address, a.http_port, None))
    if a.allow_grpc:
        services.append(("GRPC", a.grpc_address, a.grpc_port, None))
    if a.allow_metrics:
        services.append(("metrics", a.metrics_address or a.http_address, a.metrics_port, None))
    if a.allow_sagemaker:
        services.append(("SageMaker", a.http_address, a.sagemaker_port, sagemaker_range))
    if a.allow_vertex_ai:
        services.append(("Vertex AI", a.http_address, a.vertex_ai_port, None))
    for i, (name, address, port, allowed) in enumerate(services):
        # A service with a safe range is compared with every other; the rest with those after them.
        for j, (other, other_address, other_port, _) in enumerate(services):
            if j == i or (allowed is None and j < i) or address != other_address:
                continue
            if allowed is not None and not allowed[0] <= other_port <= allowed[1]:
                return (f"The server cannot listen to {other} requests at port {other_port}, "
                        f"allowed port range is [{allowed[0]}, {allowed[1]}]")
            if port == other_port:
                return (f"The server cannot listen to {name} requests and {other} requests at the same "
                        f"address and port {address}:{port}")
    return ""


def check_inference_type(value: str | None) -> str:
    """Why ``SAGEMAKER_TRITON_INFERENCE_TYPE`` cannot be served (the words of Triton's
    SageMaker entry point, ``docker/sagemaker/serve``, which refuses to start), or ''."""
    if value and value not in SAGEMAKER_INFERENCE_TYPES:
        return f"Invalid SAGEMAKER_TRITON_INFERENCE_TYPE '{value}'. Must be one of: infer, generate, generate_stream"
    return ""

