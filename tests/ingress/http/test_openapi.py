"""docs/openapi.yaml: a valid OpenAPI document, and every path it documents is
routed by a live server (no 404 "Not Found" from routing, no 405)."""

from __future__ import annotations

import http.client
from typing import Any

import orjson
import pytest
import yaml
from openapi_spec_validator import validate

from tests.support.group import Server
from tests.support.paths import ROOT

LEVEL = "e2e"

DOC = str(ROOT / "docs" / "openapi.yaml")
# Path parameters: a model that exists, except where the call would change the shared server.
VALUES = {"model": "simple", "version": "1", "region": "openapi-test"}
HARMLESS_MODEL = {"/v2/repository/models/{model}/load": "no_such_model", "/v2/repository/models/{model}/unload":
                  "no_such_model"}


def document() -> dict[str, Any]:
    with open(DOC, encoding="utf-8") as f:
        return yaml.safe_load(f)


def test_the_document_is_valid_openapi() -> None:
    validate(document())


def operations() -> list[tuple[str, str]]:
    return [(method.upper(), path) for path, item in document()["paths"].items() for method in item
            if method in ("get", "post", "put", "delete")]


@pytest.mark.parametrize(("method", "path"), operations())
def test_every_documented_path_is_served(server: Server, method: str, path: str) -> None:
    values = dict(VALUES, model=HARMLESS_MODEL.get(path, VALUES["model"]))
    url = path.format(**values)
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request(method, url, body=b"{}" if method == "POST" else None)
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status != 405, url
    if response.status == 404:  # a handler's own 404 (unknown model/region), not routing's
        assert orjson.loads(body)["error"] != "Not Found", url
