"""Under the ``tritonserver`` command, an unload that arrives while its model loads waits for that load, as
Triton's (L0_lifecycle's concurrent_model_load_unload): both calls succeed, then the model is unloaded. A real
group started as ``tritonserver`` starts it (CONVEYOR_TRITON_CLI=1, proto/triton_cli.py). ``conveyor serve`` cancels
the load instead (tests/router/test_lifecycle_agent.py holds that)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tritonclient.http as th

from conveyor.proto.triton_cli import TRITON_CLI_ENV
from tests.support.group import Server, start_server
from tests.support.python_models import write_model

LEVEL = "e2e"

pytestmark = pytest.mark.timeout(300)
CALL_TIMEOUT_S = 120.0
INIT_S = 3  # the model's initialize: the unload arrives while it runs

SLOW = '''
import os
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        open(MARK, "w").close()  # the load is under way
        time.sleep(SECONDS)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(
            r, "IN").as_numpy())]) for r in requests]
'''

CONFIG = '''
name: "slow"
backend: "python"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("unload_waits") / "models"
    root.mkdir()
    mark = root.parent / "initializing"
    write_model(str(root), "slow", SLOW.replace("MARK", repr(str(mark))).replace("SECONDS", str(INIT_S)), CONFIG)
    return root


@pytest.fixture(scope="module")
def srv(repo: Path) -> Iterator[Server]:
    server = start_server(str(repo), f"uw{os.getpid()}", "--workers", "1", "--model-control-mode", "explicit",
                          grpc=False, env={**os.environ, TRITON_CLI_ENV: "1"})
    try:
        yield server
    finally:
        assert server.stop() == 0


def call(srv: Server, what: str) -> None:
    """``load`` or ``unload`` of the model, on a client of this thread's own (tritonclient.http's are not shared
    across threads)."""
    client = th.InferenceServerClient(f"127.0.0.1:{srv.http_port}", network_timeout=CALL_TIMEOUT_S)
    try:
        (client.load_model if what == "load" else client.unload_model)("slow")
    finally:
        client.close()


def test_an_unload_during_a_load_waits_for_it(srv: Server, repo: Path) -> None:
    mark = repo.parent / "initializing"
    with ThreadPoolExecutor(2) as pool:
        load = pool.submit(call, srv, "load")
        while not mark.exists():  # bounded by the module's timeout: the load reached initialize
            assert not load.done(), load.result()
            threading.Event().wait(0.05)
        unload = pool.submit(call, srv, "unload")
        load.result()  # Triton's order: the load succeeds (Conveyor's own default: CANCELLED)
        unload.result()
    client = th.InferenceServerClient(f"127.0.0.1:{srv.http_port}", network_timeout=CALL_TIMEOUT_S)
    try:
        assert not client.is_model_ready("slow")
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert (rows["slow"]["state"], rows["slow"]["reason"]) == ("UNAVAILABLE", "unloaded")
        client.load_model("slow")  # nothing left behind: it loads again
        assert client.is_model_ready("slow")
        client.unload_model("slow")
    finally:
        client.close()
