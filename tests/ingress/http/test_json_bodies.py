"""The JSON bodies of the KServe HTTP routes, without sockets: read as JSON whatever their
Content-Type says (``curl -d`` sends a form's), as Triton reads them; deeply nested ones refused
with 400, never a 500; the settings routes bounded and refusing a client's log or trace file
(501, Triton's words) even in a body too deep to parse."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import falcon.testing
import pytest

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.http.app import build_app
from conveyor.ingress.http.observe import MAX_SETTINGS_BODY
from conveyor.proto.start_only import LOG_FILE_REFUSAL, TRACE_FILE_REFUSAL
from tests.support.fake_http import ANSWERS, EchoPlane, FakeLink

LEVEL = "unit"

# curl -d's type (urllib's too), a wrong one, and none (tritonclient.http sends none).
CONTENT_TYPES = ["application/json", "application/x-www-form-urlencoded", "text/plain", None]

# (route, a JSON body, the control op it reaches and the arguments that op gets from the body)
JSON_ROUTES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("/v2/logging", '{"log_verbose_level": 1}', "log_settings", {"settings": {"log_verbose_level": 1}}),
    ("/v2/trace/setting", '{"trace_rate": "5"}', "trace_settings", {"model": "", "settings": {"trace_rate": "5"}}),
    ("/v2/models/simple/trace/setting", '{"trace_level": ["TIMESTAMPS"]}', "trace_settings",
     {"model": "simple", "settings": {"trace_level": ["TIMESTAMPS"]}}),
    ("/v2/repository/index", '{"ready": true}', "repository_index", {"ready": True}),
    ("/v2/repository/models/simple/load", '{"parameters": {"config": "{}"}}', "repository_load",
     {"model": "simple", "config": "{}", "files": {}}),
    ("/v2/repository/models/simple/unload", '{"parameters": {"unload_dependents": true}}', "repository_unload",
     {"model": "simple", "unload_dependents": True}),
    ("/v2/systemsharedmemory/region/r/register", '{"key": "/k", "byte_size": 8}', "shm_register",
     {"kind": "system", "name": "r", "byte_size": 8, "key": "/k", "offset": 0}),
]


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.fixture
def link() -> FakeLink:
    return FakeLink(dict(ANSWERS, log_settings={}, trace_settings={}, repository_index=[], repository_load=None,
                         repository_unload=None, shm_register=None))


@pytest.fixture
def plane() -> EchoPlane:
    return EchoPlane()


@pytest.fixture
def client(link: FakeLink, plane: EchoPlane) -> falcon.testing.TestClient:
    ctx = SimpleNamespace(link=link, dataplane=plane, drain=IngressDrain())
    return falcon.testing.TestClient(build_app(ctx))  # type: ignore[arg-type]


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
@pytest.mark.parametrize(("path", "body", "op", "args"), JSON_ROUTES)
def test_json_whatever_the_content_type(client: falcon.testing.TestClient, link: FakeLink, content_type: str | None,
                                        path: str, body: str, op: str, args: dict[str, Any]) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    r = client.simulate_post(path, body=body, headers=headers)
    assert r.status_code == 200, r.text
    got = dict(link.calls[-1][1])
    got.pop("timeout_s", None)  # a load's wait for the router, not from the body
    assert (link.calls[-1][0], got) == (op, args)


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
def test_infer_json_whatever_the_content_type(client: falcon.testing.TestClient, plane: EchoPlane,
                                              content_type: str | None) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    body = '{"inputs": [{"name": "x", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}'
    r = client.simulate_post("/v2/models/simple/infer", body=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json["outputs"][0]["data"] == [1, 2]


@pytest.mark.parametrize("path", [p for p, *_ in JSON_ROUTES] + [
    "/v2/cudasharedmemory/region/r/register", "/v2/models/simple/infer", "/v2/models/simple/generate"])
@pytest.mark.parametrize("where", ["member", "whole body"])
def test_deeply_nested_json_is_a_400(client: falcon.testing.TestClient, path: str, where: str) -> None:
    # 20,000 levels: past orjson's 1024 and Python's recursion limit, under every route's body limit.
    deep = nested(20_000)
    members = f'{{"log_info": {deep}, "parameters": {deep}, "ready": {deep}}}'
    body = members if where == "member" else deep
    r = client.simulate_post(path, body=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert set(r.json) == {"error"} and "RecursionError" not in r.json["error"]


@pytest.mark.parametrize(("path", "member", "refusal"), [
    ("/v2/logging", "log_file", LOG_FILE_REFUSAL),
    ("/v2/trace/setting", "trace_file", TRACE_FILE_REFUSAL),
    ("/v2/models/simple/trace/setting", "trace_file", TRACE_FILE_REFUSAL),
])
def test_a_file_in_a_body_too_deep_is_still_refused_first(client: falcon.testing.TestClient, link: FakeLink,
                                                          path: str, member: str, refusal: str) -> None:
    # As Triton, which parses any depth and looks at the file before the other members.
    for value in ('"/tmp/pwned"', nested(5_000)):
        body = f'{{"log_info": {nested(5_000)}, "{member}": {value}}}'
        r = client.simulate_post(path, body=body)
        assert (r.status_code, r.json) == (501, {"error": refusal})
    assert link.calls == []  # nothing reached the settings


def test_settings_bodies_are_bounded(client: falcon.testing.TestClient, link: FakeLink) -> None:
    padded = '{"log_verbose_level": 1' + " " * (MAX_SETTINGS_BODY - 30) + "}"
    assert client.simulate_post("/v2/logging", body=padded).status_code == 200
    for path in ("/v2/logging", "/v2/trace/setting"):
        r = client.simulate_post(path, body=padded + " " * 30)
        assert (r.status_code, r.json) == (400, {"error": "the request body is too large"})
    assert len(link.calls) == 1


def test_settings_bodies_that_are_not_json_objects(client: falcon.testing.TestClient, link: FakeLink) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    r = client.simulate_post("/v2/logging", body="log_verbose_level=1", headers=form)  # a real form: not JSON
    assert r.status_code == 400 and r.json["error"].startswith("failed to parse the request JSON buffer: ")
    r = client.simulate_post("/v2/trace/setting", body='["trace_rate"]')
    assert (r.status_code, r.json) == (400, {"error": "the request body must be a JSON object"})
    assert client.simulate_post("/v2/logging", body="").status_code == 200  # empty: read them, as Triton
    assert link.calls == [("log_settings", {"settings": {}})]
