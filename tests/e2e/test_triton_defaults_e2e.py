"""Triton's defaults through real clients against a running group: header forwarding
(--http/--grpc-header-forward-pattern), the instance group filled in for a model
without one, and the statistics/metrics fields Triton fills."""

from __future__ import annotations

import json
import os
import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conveyor.ingress.header_forward import HeaderForward
from conveyor.proto.errors import ConveyorError
from tests.support import models, python_models
from tests.support.group import Server, start_server
from tests.support.metrics import scrape

LEVEL = "e2e"

LOG: list[str] = []


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("defaults"))
    python_models.write_model(repo, "py_identity", python_models.IDENTITY_MODEL, python_models.IDENTITY_CONFIG)
    python_models.write_model(repo, "py_repeat", python_models.REPEAT_MODEL, python_models.REPEAT_CONFIG)
    python_models.write_model(repo, "py_cached", python_models.IDENTITY_MODEL,
                              python_models.IDENTITY_CONFIG.replace('"py_identity"', '"py_cached"')
                              + "response_cache { enable: true }\n")
    # ONNX models without instance_group and with KIND_AUTO: on CPU here (no GPU).
    models.position(repo, "onnx_default", "")
    models.position(repo, "onnx_auto", "")
    for name, group in (("onnx_default", ""), ("onnx_auto", "instance_group [ { count: 2 } ]\n")):
        path = os.path.join(repo, name, "config.pbtxt")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace("instance_group [ { count: 1 kind: KIND_CPU } ]\n", group))
    LOG.clear()
    LOG.append(str(tmp_path_factory.mktemp("log") / "conveyor.log"))
    srv = start_server(repo, f"td{os.getpid()}", "--workers", "1", "--log-file", LOG[0],
                       "--http-header-forward-pattern=my_header.*|triton_.*",
                       "--grpc-header-forward-pattern", "(?-i)my_header.*",
                       "--cache-config", "local,size=1048576", "--metrics-config", "summary_latencies=true")
    yield srv
    assert srv.stop() == 0


def _identity(protocol: Any, url: str, headers: dict[str, str]) -> dict[str, Any]:
    client = protocol.InferenceServerClient(url)
    inp = protocol.InferInput("INPUT0", [1, 2], "FP32")
    inp.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
    # a copy: tritonclient.http adds its own headers to the dict it is given
    result = client.infer("py_identity", [inp], headers=dict(headers), parameters={"body": "kept"})
    seen: dict[str, Any] = json.loads(result.as_numpy("INFO").reshape(-1)[0])["parameters"]
    return seen


HEADERS = {"my_header_1": "my_value_1", "My_Header_2": "my_value_2", "header_3": "not forwarded",
           "my_header_4": 'a "quoted" string with a backslash\\ '}


def test_http_headers_matching_the_pattern_become_string_parameters(server: Server) -> None:
    seen = _identity(httpclient, server.http_url, HEADERS)
    # Case-insensitive by default, and each name as the client wrote it, as Triton 2.51 passes them.
    assert seen == {"body": "kept", "my_header_1": "my_value_1", "My_Header_2": "my_value_2",
                    "my_header_4": 'a "quoted" string with a backslash\\ '}


def test_http_reserved_header_is_refused_with_tritons_words(server: Server) -> None:
    with pytest.raises(InferenceServerException) as info:
        _identity(httpclient, server.http_url, {"triton_enable_empty_final_response": "1"})
    assert "Header 'triton_enable_empty_final_response' is reserved for Triton usage and cannot be forwarded." \
        in str(info.value)
    assert info.value.status() == "400"


def test_grpc_metadata_matching_the_pattern_become_string_parameters(server: Server) -> None:
    # gRPC metadata names are lower-case (grpc refuses others); "(?-i)" makes the pattern case-sensitive.
    # Without the trailing space of HTTP's my_header_4: HTTP/2 forbids a field value that ends in
    # whitespace (RFC 9113 8.2.1), and the h2 server refuses it (grpcio lets it through; COMPATIBILITY.md).
    metadata = {k.lower(): v.rstrip() for k, v in HEADERS.items()}
    seen = _identity(grpcclient, server.grpc_url, metadata)
    assert seen == {"body": "kept", "my_header_1": "my_value_1", "my_header_2": "my_value_2",
                    "my_header_4": 'a "quoted" string with a backslash\\'}


def test_grpc_stream_requests_carry_the_forwarded_metadata(server: Server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put(error or result), headers={"my_header_s": "v"})
    try:
        inp = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
        inp.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
        client.async_stream_infer("py_identity", [inp])
        result = results.get(timeout=30)
        assert not isinstance(result, Exception), result
        assert json.loads(result.as_numpy("INFO").reshape(-1)[0])["parameters"] == {"my_header_s": "v"}
    finally:
        client.stop_stream()


def test_header_forward_rules() -> None:
    params: dict[str, Any] = {}
    HeaderForward("x-.*").apply([("X-A", "1"), ("y", "2"), ("pre-x-b", "3")], params)
    assert params == {"X-A": "1", "pre-x-b": "3"}  # a partial match, as RE2's PartialMatch
    strict: dict[str, Any] = {}
    HeaderForward("(?-i)x-.*").apply([("X-A", "1"), ("x-b", b"2")], strict)
    assert strict == {"x-b": "2"}
    with pytest.raises(ConveyorError, match="Header 'priority' is reserved"):
        HeaderForward(".*").apply([("priority", "1")], {})


def _stream_repeat(url: str, values: list[int]) -> list[Any]:
    client = grpcclient.InferenceServerClient(url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        inp = grpcclient.InferInput("IN", [len(values)], "INT32")
        inp.set_data_from_numpy(np.array(values, dtype=np.int32))
        client.async_stream_infer("py_repeat", [inp], enable_empty_final_response=True)
        got = []
        while True:
            item = results.get(timeout=30)
            got.append(item)
            if isinstance(item, Exception) or item.get_response().parameters["triton_final_response"].bool_param:
                return got
    finally:
        client.stop_stream()


def test_response_stats_of_a_decoupled_model_by_response_index(server: Server) -> None:
    for _ in range(2):
        assert len(_stream_repeat(server.grpc_url, [5, 6, 7])) == 4  # three responses, then a bare final flag
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics("py_repeat")
    by_index = stats["model_stats"][0]["response_stats"]
    assert sorted(by_index) == ["0", "1", "2", "3"]
    for key in ("0", "1", "2"):
        r = by_index[key]
        assert r["success"]["count"] == 2 and r["compute_infer"]["count"] == 2 and r["compute_output"]["count"] == 2
        assert r["fail"]["count"] == r["empty_response"]["count"] == r["cancel"]["count"] == 0
        assert r["success"]["ns"] > 0
    assert by_index["3"]["empty_response"]["count"] == 2 and by_index["3"]["success"]["count"] == 0
    # The same over gRPC, as its protobuf map.
    proto = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics("py_repeat")
    grpc_stats = proto.model_stats[0].response_stats
    assert sorted(grpc_stats) == ["0", "1", "2", "3"] and grpc_stats["1"].success.count == 2
    # A model that is not decoupled has none, as in Triton.
    plain = httpclient.InferenceServerClient(server.http_url).get_inference_statistics("py_identity")
    assert plain["model_stats"][0]["response_stats"] == {}
    assert plain["model_stats"][0]["memory_usage"] == []  # CPU instances: nothing measured, as Triton's CPU backends


def test_response_stats_classes() -> None:
    from conveyor.proto.errors import Status
    from conveyor.router.observability.stats import ModelStats

    s = ModelStats("m", "1")
    s.record_response(0, 10, None, True)
    s.record_response(1, 20, int(Status.INTERNAL), False)
    s.record_response(1, 5, int(Status.CANCELLED), False)
    s.record_response(2, 7, None, False)
    wire = s.wire()["response_stats"]
    assert wire["0"]["success"] == {"count": 1, "ns": 10} and wire["0"]["compute_output"]["count"] == 1
    assert wire["1"]["fail"] == {"count": 1, "ns": 20} and wire["1"]["compute_infer"] == {"count": 1, "ns": 20}
    assert wire["1"]["cancel"] == {"count": 1, "ns": 5} and wire["1"]["compute_output"]["count"] == 0
    assert wire["2"]["empty_response"] == {"count": 1, "ns": 7} and wire["2"]["compute_infer"]["count"] == 1


def test_load_duration_gauge(server: Server) -> None:
    metrics = scrape(server)
    for model in ("py_identity", "py_repeat"):
        took = metrics[f'nv_model_load_duration_secs{{model="{model}",version="1"}}']
        assert 0 < took < 60


def test_cache_summaries_for_a_response_cache_model(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    inp.set_data_from_numpy(np.full((1, 3), 0.25, dtype=np.float32))
    for _ in range(3):  # one miss, then hits
        client.infer("py_cached", [inp])
    metrics = scrape(server)
    labels = 'model="py_cached",version="1"'
    assert metrics[f"nv_cache_miss_summary_per_model_count{{{labels}}}"] == 1
    assert metrics[f"nv_cache_hit_summary_per_model_count{{{labels}}}"] == 2
    assert f'nv_cache_hit_summary_per_model{{{labels},quantile="0.5"}}' in metrics
    assert metrics[f"nv_cache_num_hits_per_model{{{labels}}}"] == 2
    # As Triton: no request summary for a cache model, no cache summaries for the others.
    assert f"nv_inference_request_summary_us_count{{{labels}}}" not in metrics
    assert 'nv_inference_request_summary_us_count{model="py_identity",version="1"}' in metrics
    # Cache counters only for cache models, as Triton's reporter (qa/L0_metrics test_cache_counters_missing).
    assert 'nv_cache_num_hits_per_model{model="py_identity",version="1"}' not in metrics
    assert 'nv_cache_hit_summary_per_model_count{model="py_identity",version="1"}' not in metrics


def _groups(config: dict[str, Any]) -> list[tuple[str, str, int, list[int]]]:
    return [(g["name"], g["kind"], g["count"], g.get("gpus", [])) for g in config["instance_group"]]


def test_default_and_auto_groups_stay_on_cpu_without_a_gpu_and_config_shows_them(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    # Triton's NormalizeInstanceGroup: the default group is named after the model; KIND_AUTO resolved.
    assert _groups(client.get_model_config("onnx_default")) == [("onnx_default", "KIND_CPU", 1, [])]
    assert _groups(client.get_model_config("onnx_auto")) == [("onnx_auto_0", "KIND_CPU", 2, [])]
    assert _groups(client.get_model_config("py_identity")) == [("py_identity", "KIND_CPU", 1, [])]
    proto = grpcclient.InferenceServerClient(server.grpc_url).get_model_config("onnx_auto").config
    assert proto.instance_group[0].kind == 2 and proto.instance_group[0].count == 2  # KIND_CPU
    inp = httpclient.InferInput("INPUT0", [2, 1], "INT32")
    inp.set_data_from_numpy(np.ones((2, 1), dtype=np.int32))
    for model in ("onnx_default", "onnx_auto"):
        np.testing.assert_array_equal(client.infer(model, [inp]).as_numpy("OUTPUT0"), [[1], [2]])
    with open(LOG[0], encoding="utf-8") as f:
        said = [line for line in f if "no GPU that the backend can use" in line]
    assert len(said) == 1, said  # once for the group, not once per model
