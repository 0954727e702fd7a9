"""Megabyte buffers freed by a request stay in the heap for the next one (deploy/runtime/heap.py): no page
faults per request, the cost that doubled the HTTP ingress's CPU per 1 MiB request."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

LEVEL = "e2e"

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

# A request's life on the main thread: its body and its response, a MiB each, made and freed.
FAULTS_PER_ROUND = """
import resource, sys
from conveyor.deploy.runtime.heap import keep_freed_heap
print(keep_freed_heap())
def one_request():
    body = bytes(1 << 20)
    response = b"".join((b"header", body))
    del body, response
for _ in range(5):
    one_request()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    one_request()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
"""


def run(env: dict[str, str]) -> tuple[str, float]:
    out = subprocess.run([sys.executable, "-c", FAULTS_PER_ROUND], env={**os.environ, **env}, text=True,
                         capture_output=True, check=True, timeout=60).stdout.split()
    return out[0], float(out[1])


def test_a_request_with_megabyte_buffers_faults_no_pages_in_once_the_heap_is_kept() -> None:
    kept, faults = run({})
    assert kept == "True"
    assert faults < 8  # a MiB freshly mapped is 256 faults


def test_the_operators_own_glibc_settings_are_left_alone() -> None:
    kept, faults = run({"MALLOC_TRIM_THRESHOLD_": "0"})
    assert kept == "False"
    assert faults >= 256  # trimmed at once, as asked: every MiB comes back page by page
