"""The whole group answers a plain HTTP client (no tritonclient): liveness and one infer."""

from __future__ import annotations

import json
import urllib.request

from tests.support.group import Server

LEVEL = "e2e"


def test_live_and_infer_json(server: Server) -> None:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/live") as r:
        assert r.status == 200
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
        ]
    }
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/simple/infer", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req) as r:
        out = json.loads(r.read())
    by_name = {o["name"]: o for o in out["outputs"]}
    assert by_name["OUTPUT0"]["data"] == [i + 1 for i in range(16)]
    assert by_name["OUTPUT1"]["data"] == [i - 1 for i in range(16)]
