"""Plain HTTP calls, as SageMaker's and Vertex AI's health checks and clients make them, and the
``simple`` model's inputs they send."""

from __future__ import annotations

import urllib.error
import urllib.request


def call(port: int, path: str, body: bytes | None = None, method: str | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


A = list(range(16))
B = [1] * 16
