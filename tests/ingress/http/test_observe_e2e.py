"""Logging and trace extensions on a group of its own: settings reach every process."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conveyor.deploy.example_repo import add_sub
from tests.support.group import Server, start_server

LEVEL = "e2e"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the group logs and traces: set at start, as only there they can be (proto/start_only.py)."""
    return tmp_path_factory.mktemp("observe_files")


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory, files: Path) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("observe_models"))
    add_sub(repo, "simple_nobatch", 0)
    srv = start_server(repo, f"o{os.getpid()}", "--workers", "1", "--trace-config", "rate=1", "--trace-config",
                       f"triton,file={files / 'trace.json'}", "--log-file", str(files / "conveyor.log"))
    yield srv
    assert srv.stop() == 0


def infer(client: httpclient.InferenceServerClient, headers: dict[str, str] | None = None) -> None:
    a = np.arange(16, dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [16], "INT32"), httpclient.InferInput("INPUT1", [16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    client.infer("simple_nobatch", inputs, headers=headers)


def wait_for(predicate: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_log_settings_reach_the_worker(observed: Server, files: Path) -> None:
    client = httpclient.InferenceServerClient(observed.http_url)
    before = client.get_log_settings()
    log_file = files / "conveyor.log"
    assert before == {"log_file": str(log_file), "log_info": True, "log_warning": True, "log_error": True,
                      "log_verbose_level": 0, "log_format": "conveyor"}
    after = client.update_log_settings({"log_verbose_level": 1})
    assert after["log_verbose_level"] == 1 and after["log_file"] == str(log_file)
    # Each process says so at DEBUG once its new settings are in place: the worker too.
    wait_for(lambda: log_file.exists() and any(
        "worker[" in line and "DEBUG" in line for line in log_file.read_text().splitlines()))
    grpc = grpcclient.InferenceServerClient(observed.grpc_url)
    settings = grpc.get_log_settings(as_json=True)["settings"]
    assert settings["log_verbose_level"]["uint32_param"] == 1
    grpc.update_log_settings({"log_verbose_level": 0})
    with pytest.raises(Exception, match="log_format"):
        client.update_log_settings({"log_format": "fancy"})


def test_trace_of_one_request_has_every_actor(observed: Server, files: Path) -> None:
    client = httpclient.InferenceServerClient(observed.http_url)
    assert client.get_trace_settings()["trace_rate"] == "1"
    got = client.update_trace_settings("simple_nobatch", {"trace_level": ["TIMESTAMPS"], "log_frequency": "1"})
    assert got["trace_level"] == ["TIMESTAMPS"] and got["log_frequency"] == "1"
    assert got["trace_file"] == str(files / "trace.json")
    assert client.get_trace_settings()["trace_level"] == ["OFF"]  # the global one is untouched
    # The ingress learns that tracing is on through the router's SettingsUpdate.
    first = files / "trace.json.0"
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    def traced() -> bool:
        infer(client, {"traceparent": parent})
        return first.exists()

    wait_for(traced)
    traces = json.loads(first.read_text())
    assert len(traces) == 1 and traces[0]["model_name"] == "simple_nobatch"
    names = [t["name"] for t in traces[0]["timestamps"]]
    assert {"INGRESS_RECV", "INGRESS_SEND"} <= set(names)  # ingress
    assert {"QUEUE_START", "DISPATCH", "REQUEST_END"} <= set(names)  # router
    assert {"COMPUTE_START", "COMPUTE_END"} <= set(names)  # worker
    stamps = {t["name"]: t["ns"] for t in traces[0]["timestamps"]}
    assert stamps["INGRESS_RECV"] <= stamps["QUEUE_START"] <= stamps["COMPUTE_START"] <= stamps["COMPUTE_END"]
    assert stamps["COMPUTE_END"] <= stamps["REQUEST_END"] <= stamps["INGRESS_SEND"]
    assert traces[0]["traceparent"] == parent

    grpc = grpcclient.InferenceServerClient(observed.grpc_url)
    cleared = grpc.update_trace_settings("simple_nobatch", {"trace_level": None, "log_frequency": None},
                                         as_json=True)
    assert cleared["settings"]["trace_level"]["value"] == ["OFF"]
    with pytest.raises(Exception, match="trace_level"):
        client.update_trace_settings(settings={"trace_level": ["LOUD"]})
