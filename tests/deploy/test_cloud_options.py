"""Triton's SageMaker / Vertex AI flags and the AIP_* environment, as parsed."""

from __future__ import annotations

import pytest

from conveyor.deploy.cli import build_tritonserver_parser
from conveyor.deploy.cloud_options import check_cloud_args, fold_storage_uri
from conveyor.deploy.settings import ServeSettings

LEVEL = "unit"


def test_safe_port_range_and_collisions() -> None:
    p = build_tritonserver_parser()
    on = ["--model-repository", "/m", "--allow-sagemaker", "true"]
    a = p.parse_args([*on, "--sagemaker-safe-port-range", "8000-8002"])
    assert check_cloud_args(ServeSettings.of(a)) == ""
    a = p.parse_args([*on, "--sagemaker-safe-port-range", "8000-8001"])
    assert check_cloud_args(ServeSettings.of(a)) == (
        "The server cannot listen to metrics requests at port 8002, allowed port range is [8000, 8001]"
    )
    a = p.parse_args([*on, "--sagemaker-port", "8000"])
    assert "same address and port 0.0.0.0:8000" in check_cloud_args(ServeSettings.of(a))


def test_vertex_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_HTTP_PORT", "7080")
    monkeypatch.setenv("AIP_STORAGE_URI", "gs://bucket/models")
    monkeypatch.delenv("AIP_PREDICT_ROUTE", raising=False)
    a = build_tritonserver_parser().parse_args([])
    fold_storage_uri(a)
    assert (a.allow_vertex_ai, a.allow_http, a.allow_grpc, a.vertex_ai_port) == (True, False, False, 7080)
    assert a.model_repository == ["gs://bucket/models"]
    assert check_cloud_args(ServeSettings.of(a)) == "API_PREDICT_ROUTE is not defined for Vertex AI endpoint"
