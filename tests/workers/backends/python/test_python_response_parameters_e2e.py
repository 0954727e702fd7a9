"""A Python model's response parameters (``InferenceResponse(parameters=...)``)
reach tritonclient over HTTP and gRPC, on decoupled streams, and in the generate
extension's JSON; the real process group serves them."""

from __future__ import annotations

import json
import queue
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.generate import events, post
from tests.support.group import Server

LEVEL = "e2e"

IN = np.array([3, 4, 5], dtype=np.int32)
EXPECTED = {"note": "from py_params", "count": 3, "odd": True}


def test_http_response_parameters(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("IN", [3], "INT32")
    inp.set_data_from_numpy(IN)
    result = client.infer("py_params", [inp], parameters={"tag": "h"})
    assert result.get_response()["parameters"] == {**EXPECTED, "tag": "h"}
    np.testing.assert_array_equal(result.as_numpy("OUT"), IN)


def test_grpc_response_parameters_keep_their_types(server: Server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("IN", [3], "INT32")
    inp.set_data_from_numpy(IN)
    params = client.infer("py_params", [inp]).get_response().parameters
    assert params["note"].string_param == "from py_params"
    assert params["count"].int64_param == 3 and params["odd"].bool_param is True
    assert "tag" not in params


def test_decoupled_stream_responses_carry_their_parameters(server: Server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        inp = grpcclient.InferInput("IN", [3], "INT32")
        inp.set_data_from_numpy(np.array([7, 8, 9], dtype=np.int32))
        client.async_stream_infer("py_repeat", [inp])
        got = [replies.get(timeout=30) for _ in range(3)]
    finally:
        client.stop_stream()
        client.close()
    assert [e for _, e in got] == [None] * 3
    assert [r.get_response().parameters["position"].int64_param for r, _ in got] == [0, 1, 2]


def test_generate_merges_response_parameters_into_its_json(server: Server) -> None:
    status, _, raw = post(server, "/v2/models/py_params/generate", {"IN": [3, 4, 5], "parameters": {"tag": "g"}})
    assert status == 200, raw
    assert json.loads(raw) == {"model_name": "py_params", "model_version": "1", "OUT": [3, 4, 5],
                               **EXPECTED, "tag": "g"}
    status, _, raw = post(server, "/v2/models/py_repeat/generate_stream", {"IN": [5, 6]})
    assert status == 200
    assert [(e["OUT"], e["position"]) for e in events(raw)] == [(5, 0), (6, 1)]
