"""Triton's generate extension as a test calls it: a JSON POST, and Server-Sent Events read back."""

from __future__ import annotations

import http.client
import json
from typing import Any

from tests.support.group import Server


def post(srv: Server, path: str, body: Any) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=60)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type") or "", r.read()
    finally:
        conn.close()


def events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in raw.decode().splitlines() if line.startswith("data:")]
