"""Triton's SageMaker and Vertex AI flags, and the ``AIP_*`` environment Vertex AI sets.

``AIP_MODE=PREDICTION`` turns the Vertex AI endpoint on and the HTTP and gRPC ones
off by default; ``AIP_HTTP_PORT`` is ``--vertex-ai-port``'s default; ``AIP_STORAGE_URI``
is the model repository when none is given; ``AIP_PREDICT_ROUTE`` and
``AIP_HEALTH_ROUTE`` are the endpoint's routes (both required). As Triton's
command_line_parser.cc.
"""

from __future__ import annotations

import argparse
import os

from conveyor.deploy.options import triton_bool

SAGEMAKER_INFERENCE_TYPE_ENV = "SAGEMAKER_TRITON_INFERENCE_TYPE"
SAGEMAKER_INFERENCE_TYPES = ("infer", "generate", "generate_stream")  # what /invocations maps to


def port_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    try:
        if not sep:
            raise ValueError
        return int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "Cannot parse pair option due to incorrect number of inputs.--<pair option> argument requires "
            f"format <first>-<second>. Found: {text}"
        ) from None


def add_cloud_endpoints(p: argparse.ArgumentParser) -> None:
    vertex_env = os.environ.get("AIP_MODE", "") == "PREDICTION"
    g = p.add_argument_group("SageMaker and Vertex AI endpoints")
    g.add_argument("--allow-sagemaker", type=triton_bool, default=False, metavar="BOOL",
                   help="serve SageMaker's /ping, /invocations and /models on --sagemaker-port (default false)")
    g.add_argument("--sagemaker-port", type=int, default=8080, help="the SageMaker endpoint's port (default 8080)")
    g.add_argument("--sagemaker-safe-port-range", type=port_range, default=None, metavar="<integer>-<integer>",
                   help="the ports the other endpoints must use when SageMaker is on")
    g.add_argument("--allow-vertex-ai", type=triton_bool, default=vertex_env, metavar="BOOL",
                   help="serve Vertex AI's AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE on --vertex-ai-port "
                        "(default true when AIP_MODE=PREDICTION, which also turns HTTP and gRPC off by default)")
    g.add_argument("--vertex-ai-port", type=int, default=int(os.environ.get("AIP_HTTP_PORT") or 8080),
                   help="the Vertex AI endpoint's port (default AIP_HTTP_PORT, else 8080)")
    g.add_argument("--vertex-ai-default-model", default="", metavar="NAME",
                   help="the model AIP_PREDICT_ROUTE infers (default: the repository's only model)")
    if vertex_env:
        p.set_defaults(allow_http=False, allow_grpc=False)


def fold_storage_uri(a: argparse.Namespace) -> None:
    """No --model-repository: AIP_STORAGE_URI is the repository, as in Triton."""
    uri = os.environ.get("AIP_STORAGE_URI", "")
    if not a.model_repository and uri:
        a.model_repository = [uri]


def check_cloud_args(a: argparse.Namespace) -> str:
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


def cloud_args(a: argparse.Namespace) -> list[str]:
    """The endpoint flags, as the supervisor passes them on to the ingress processes."""
    return ["--sagemaker-port", str(a.sagemaker_port), "--vertex-ai-port", str(a.vertex_ai_port),
            "--vertex-ai-default-model", a.vertex_ai_default_model]
