"""Attacks on the log and trace settings of a real group (Triton's CVE-2024-0087 class and its
restricted-API categories), over HTTP (urllib, httpx, tritonclient), gRPC (tritonclient) and the
Vertex AI port: a client cannot choose where the server writes its log or traces, ``trace`` and
``logging`` are restricted over HTTP as Triton restricts them, deeply nested bodies are 400s, and
the JSON bodies are read as JSON whatever their Content-Type (``curl -d``), as in Triton.

One group: ``--log-file`` and ``--trace-config triton,file=`` set at start,
``--http-restricted-api=trace,logging:tk=v``, gRPC unrestricted, Vertex AI on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import add_sub
from conveyor.deploy.ports import free_port
from conveyor.proto.start_only import LOG_FILE_REFUSAL, TRACE_FILE_REFUSAL
from tests.support.cloud_http import A, B, call
from tests.support.group import Server, start_server, wait_ready
from tests.support.waiting import eventually

LEVEL = "e2e"

TK = {"tk": "v"}
REFUSED_403 = {"error": "This API is restricted, expecting header 'tk'"}
PREDICT = "/v1/endpoints/e/deployedModels/m:predict"
HEALTH = "/v1/endpoints/e/deployedModels/m"


@dataclass
class Group:
    server: Server
    vertex: int
    log: Path  # where --log-file put the log
    trace: Path  # --trace-config triton,file=
    attacker: Path  # a folder the attacks aim at: nothing may appear in it

    def pwned(self) -> list[str]:
        return sorted(os.listdir(self.attacker))


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    tmp = tmp_path_factory.mktemp("settings_files")
    repo = tmp / "repo"
    add_sub(str(repo), "simple", 0)
    attacker = tmp / "attacker"
    attacker.mkdir()
    vertex = free_port()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AIP_PREDICT_ROUTE", PREDICT)
        env.setenv("AIP_HEALTH_ROUTE", HEALTH)
        srv = start_server(
            str(repo), f"sf{os.getpid()}", "--workers", "1", "--log-file", str(tmp / "server.log"),
            "--trace-config", f"triton,file={tmp / 'server.trace'}", "--trace-config", "rate=1",
            "--http-restricted-api=trace,logging:tk=v",
            "--allow-vertex-ai", "true", "--vertex-ai-port", str(vertex),
        )
    try:
        wait_ready(srv.http_port, srv.proc, (vertex,))
        yield Group(srv, vertex, tmp / "server.log", tmp / "server.trace", attacker)
    finally:
        assert srv.stop() == 0


def post(group: Group, path: str, body: bytes | str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """A POST as ``curl -d`` sends it (urllib: Content-Type application/x-www-form-urlencoded)."""
    data = body.encode() if isinstance(body, str) else body
    status, _, answer = call(group.server.http_port, path, data, "POST", headers)
    return status, json.loads(answer) if answer else None


def get(group: Group, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    status, _, answer = call(group.server.http_port, path, None, "GET", headers)
    return status, json.loads(answer) if answer else None


def as_json(doc: Any) -> str:
    return json.dumps(doc)


def test_trace_and_logging_need_the_header(group: Group) -> None:
    pwned_log, pwned_trace = str(group.attacker / "pwned.log"), str(group.attacker / "pwned.trace")
    calls = [("GET", "/v2/logging", None), ("POST", "/v2/logging", {"log_file": pwned_log}),
             ("POST", "/v2/logging", {"log_verbose_level": 1}),
             ("GET", "/v2/trace/setting", None), ("GET", "/v2/models/simple/trace/setting", None),
             ("POST", "/v2/trace/setting", {"trace_file": pwned_trace, "trace_level": ["TIMESTAMPS"]}),
             ("POST", "/v2/models/simple/trace/setting", {"trace_level": ["TIMESTAMPS"]})]
    for method, path, doc in calls:
        for headers in ({}, {"tk": "w"}, {"tk-x": "v"}):
            if method == "GET":
                assert get(group, path, headers) == (403, REFUSED_403), (path, headers)
            else:
                assert post(group, path, as_json(doc), headers) == (403, REFUSED_403), (path, headers)
    client = th.InferenceServerClient(group.server.http_url)
    for refused in (client.get_log_settings, client.get_trace_settings,
                    lambda: client.update_log_settings({"log_file": pwned_log})):
        with pytest.raises(InferenceServerException) as err:
            refused()
        assert (err.value.status(), err.value.message()) == ("403", REFUSED_403["error"])
    assert client.get_log_settings(headers={"TK": "v"})["log_verbose_level"] == 0  # any header case
    assert group.pwned() == []


def test_http_log_file_is_refused(group: Group) -> None:
    pwned = str(group.attacker / "pwned.log")
    before = get(group, "/v2/logging", TK)[1]
    assert before["log_file"] == str(group.log)
    refusal = (501, {"error": LOG_FILE_REFUSAL})
    for doc in ({"log_file": pwned}, {"log_file": str(group.log)}, {"log_file": ""}, {"log_file": 0},
                {"log_verbose_level": 1, "log_info": False, "log_file": pwned},  # nothing else is applied
                {"log_file": pwned, "log_verbose_level": 1}):
        assert post(group, "/v2/logging", as_json(doc), TK) == refusal, doc
        r = httpx.post(f"http://{group.server.http_url}/v2/logging", json=doc, headers=TK, timeout=30)
        assert (r.status_code, r.json()) == refusal
    with pytest.raises(InferenceServerException) as err:
        th.InferenceServerClient(group.server.http_url).update_log_settings({"log_file": pwned}, headers=TK)
    assert (err.value.status(), err.value.message()) == ("501", LOG_FILE_REFUSAL)
    # null leaves it as it is (Triton's 200)
    assert post(group, "/v2/logging", '{"log_file": null}', TK) == (200, before)
    assert get(group, "/v2/logging", TK) == (200, before)
    assert group.pwned() == []


def test_http_trace_file_is_refused(group: Group) -> None:
    pwned = str(group.attacker / "pwned.trace")
    refusal = (501, {"error": TRACE_FILE_REFUSAL})
    for path in ("/v2/trace/setting", "/v2/models/simple/trace/setting"):
        before = get(group, path, TK)[1]
        assert before["trace_file"] == str(group.trace)
        for doc in ({"trace_file": pwned}, {"trace_file": None}, {"trace_file": str(group.trace)},
                    {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1", "trace_file": pwned}):
            assert post(group, path, as_json(doc), TK) == refusal, (path, doc)
            r = httpx.post(f"http://{group.server.http_url}{path}", json=doc, headers=TK, timeout=30)
            assert (r.status_code, r.json()) == refusal
        assert get(group, path, TK) == (200, before)  # nothing applied
    with pytest.raises(InferenceServerException) as err:
        th.InferenceServerClient(group.server.http_url).update_trace_settings(
            "simple", {"trace_file": pwned, "trace_level": ["TIMESTAMPS"]}, headers=TK)
    assert (err.value.status(), err.value.message()) == ("501", TRACE_FILE_REFUSAL)
    assert group.pwned() == []


def test_grpc_log_and_trace_files_are_refused(group: Group) -> None:
    pwned_log, pwned_trace = str(group.attacker / "pwned.log"), str(group.attacker / "pwned.trace")
    client = tg.InferenceServerClient(group.server.grpc_url)
    before = client.get_log_settings(as_json=True)["settings"]
    assert before["log_file"] == {"string_param": str(group.log)}
    # None: an entry without a value, refused as well (as Triton)
    log_attacks: list[dict[str, Any]] = [{"log_file": pwned_log}, {"log_file": ""}, {"log_file": None},
                                         {"log_verbose_level": 1, "log_file": pwned_log}]
    for log_attack in log_attacks:
        with pytest.raises(InferenceServerException) as err:
            client.update_log_settings(log_attack)
        assert (err.value.status(), err.value.message()) == ("StatusCode.UNIMPLEMENTED", LOG_FILE_REFUSAL)
    assert client.get_log_settings(as_json=True)["settings"] == before
    for model in ("", "simple"):
        trace_before = client.get_trace_settings(model, as_json=True)
        trace_attacks: list[dict[str, Any]] = [{"trace_file": pwned_trace}, {"trace_file": None},
                                               {"trace_level": ["TIMESTAMPS"], "trace_file": pwned_trace}]
        for trace_attack in trace_attacks:
            with pytest.raises(InferenceServerException) as err:
                client.update_trace_settings(model, trace_attack)
            assert (err.value.status(), err.value.message()) == ("StatusCode.UNIMPLEMENTED", TRACE_FILE_REFUSAL)
        assert client.get_trace_settings(model, as_json=True) == trace_before
    assert group.pwned() == []


def _infer(group: Group) -> None:
    inputs = [th.InferInput("INPUT0", [16], "INT32"), th.InferInput("INPUT1", [16], "INT32")]
    inputs[0].set_data_from_numpy(np.array(A, np.int32))
    inputs[1].set_data_from_numpy(np.array(B, np.int32))
    th.InferenceServerClient(group.server.http_url).infer("simple", inputs)


def test_the_log_and_traces_stay_where_the_start_put_them(group: Group) -> None:
    # Set as curl -d sends it (a form's Content-Type): read as JSON, as Triton reads it.
    assert post(group, "/v2/logging", '{"log_verbose_level": 1}', TK)[0] == 200
    eventually(lambda: any("worker[" in line and "DEBUG" in line for line in group.log.read_text().splitlines()),
               what="the worker's DEBUG lines in the start-up log")
    assert post(group, "/v2/logging", '{"log_verbose_level": 0}', TK)[1]["log_file"] == str(group.log)
    model = "/v2/models/simple/trace/setting"
    assert post(group, model, '{"trace_level": ["TIMESTAMPS"], "log_frequency": "1"}', TK)[0] == 200
    first = Path(f"{group.trace}.0")

    def traced() -> bool:
        _infer(group)
        return first.exists()

    eventually(traced, what="a trace in the start-up trace file")
    assert json.loads(first.read_text())[0]["model_name"] == "simple"
    assert post(group, model, '{"trace_level": null, "log_frequency": null}', TK)[0] == 200
    assert group.pwned() == []


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_json_bodies_whatever_the_content_type(group: Group, content_type: str | None) -> None:
    headers = {**TK, "Content-Type": content_type} if content_type else TK
    url = f"http://{group.server.http_url}"
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        r = client.post("/v2/logging", content=b'{"log_info": true}')
        assert (r.status_code, r.json()["log_info"]) == (200, True)
        r = client.post("/v2/trace/setting", content=b'{"trace_rate": "1"}')
        assert (r.status_code, r.json()["trace_rate"]) == (200, "1")
        r = client.post("/v2/models/simple/trace/setting", content=b'{"trace_count": null}')
        assert r.status_code == 200
        r = client.post("/v2/repository/index", content=b'{"ready": true}')
        assert r.status_code == 200 and [m["name"] for m in r.json()] == ["simple"]
        doc = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [16], "data": A},
                          {"name": "INPUT1", "datatype": "INT32", "shape": [16], "data": B}]}
        r = client.post("/v2/models/simple/infer", content=json.dumps(doc).encode())
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [a + b for a, b in zip(A, B, strict=True)]


def test_deeply_nested_json_is_a_400(group: Group) -> None:
    deep = "[" * 100_000 + "1" + "]" * 100_000
    for path in ("/v2/logging", "/v2/trace/setting", "/v2/models/simple/trace/setting", "/v2/repository/index",
                 "/v2/repository/models/simple/unload", "/v2/models/simple/infer"):
        for body in (deep, '{"log_info": ' + deep + ', "ready": ' + deep + ', "parameters": ' + deep + "}"):
            status, answer = post(group, path, body, TK)
            assert status == 400 and set(answer) == {"error"}, (path, answer)
    deep_shm = "[" * 20_000 + "1" + "]" * 20_000  # under the register body's 64 KiB
    status, answer = post(group, "/v2/systemsharedmemory/region/r/register", '{"key": ' + deep_shm + "}")
    assert status == 400 and set(answer) == {"error"}
    # a client's file in a body too deep to parse is refused all the same, before the rest
    status, answer = post(group, "/v2/logging", '{"log_info": ' + deep + ', "log_file": "/tmp/x"}', TK)
    assert (status, answer) == (501, {"error": LOG_FILE_REFUSAL})
    assert get(group, "/v2/health/live")[0] == 200


def test_vertex_ai_does_not_redirect_to_the_settings(group: Group) -> None:
    for route in ("v2/logging", "v2/trace/setting", "v2/models/simple/trace/setting"):
        for headers in ({}, TK):
            status, _, body = call(group.vertex, PREDICT, as_json({"log_file": "/tmp/x"}).encode(), "POST",
                                   {**headers, "X-Vertex-Ai-Triton-Redirect": route})
            assert (status, body) == (400, b""), route  # as any route Triton's Vertex AI server does not serve
    status, _, body = call(group.vertex, PREDICT, b"", "POST", {"X-Vertex-Ai-Triton-Redirect": "v2/models/simple"})
    assert status == 200 and json.loads(body)["name"] == "simple"


def test_vertex_ai_refuses_to_redirect_to_shared_memory_registration_and_model_control(group: Group) -> None:
    """Triton's Vertex AI server redirects to the shared-memory status and the repository index only: registration
    and load/unload are a 403 with no body, whatever the restricted-API headers (qa/L0_vertex_ai)."""
    register = as_json({"key": "test_shm", "byte_size": 1024}).encode()
    for route, body in (("v2/systemsharedmemory/region/r/register", register),
                        ("v2/systemsharedmemory/unregister", b""), ("v2/cudasharedmemory/region/r/register", register),
                        ("v2/repository/models/simple/unload", b""), ("v2/repository/models/simple/load", b""),
                        ("v2/repository/r/models/simple/unload", b"")):
        for headers in ({}, TK):
            status, _, answer = call(group.vertex, PREDICT, body, "POST",
                                     {**headers, "X-Vertex-Ai-Triton-Redirect": route})
            assert (status, answer) == (403, b""), route
    for route in ("v2/systemsharedmemory/status", "v2/cudasharedmemory/status", "v2/repository/index"):
        status, _, _ = call(group.vertex, PREDICT, b"", "POST", {"X-Vertex-Ai-Triton-Redirect": route})
        assert status == 200, route
    assert get(group, "/v2/models/simple/ready")[0] == 200  # still loaded
    assert group.pwned() == []
