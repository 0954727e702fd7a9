"""Triton's generate extension over HTTP against the real server: /generate for an
ordinary model, /generate_stream as Server-Sent Events for a decoupled Python model
(which Triton's HTTP infer endpoint refuses), and errors as events."""

from __future__ import annotations

import json

from tests.support.generate import events, post
from tests.support.group import Server

LEVEL = "e2e"


def test_generate_on_an_ordinary_model(server: Server) -> None:
    body = {"id": "g1", "INPUT0": list(range(16)), "INPUT1": [1] * 16, "stream": True}  # unknown keys are ignored
    status, ctype, raw = post(server, "/v2/models/simple/generate", body)
    assert status == 200 and ctype.startswith("application/json"), raw
    doc = json.loads(raw)
    assert doc["id"] == "g1" and doc["model_name"] == "simple"
    assert doc["OUTPUT0"] == [[i + 1 for i in range(16)]]  # batch of one, as the model answers
    assert doc["OUTPUT1"] == [[i - 1 for i in range(16)]]


def test_generate_stream_streams_a_decoupled_model(server: Server) -> None:
    status, ctype, raw = post(server, "/v2/models/py_repeat/generate_stream", {"IN": [5, 6, 7]})
    assert status == 200 and ctype.startswith("text/event-stream"), raw
    got = events(raw)
    assert [(e["OUT"], e["IDX"]) for e in got] == [(5, 0), (6, 1), (7, 2)]


def test_generate_on_a_decoupled_model_with_several_responses_says_use_the_stream(server: Server) -> None:
    status, _, raw = post(server, "/v2/models/py_repeat/generate", {"IN": [5, 6]})
    assert status == 400
    assert "use generate_stream" in json.loads(raw)["error"]
    status, _, raw = post(server, "/v2/models/py_repeat/generate", {"IN": [9]})
    assert status == 200 and json.loads(raw)["OUT"] == 9


def test_errors(server: Server) -> None:
    status, _, raw = post(server, "/v2/models/py_repeat/generate_stream", {"IN": [4, -1, 5]})
    assert status == 200
    got = events(raw)
    assert got[0]["OUT"] == 4 and "value -1 at 1 is not allowed" in got[1]["error"] and got[2]["OUT"] == 5
    status, _, raw = post(server, "/v2/models/nope/generate", {"IN": [1]})
    assert status == 404 and "nope" in json.loads(raw)["error"]
    status, _, raw = post(server, "/v2/models/simple/generate", {"INPUT0": list(range(16))})
    assert status == 400 and "missing required input" in json.loads(raw)["error"]
