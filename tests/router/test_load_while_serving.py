"""A slow model load stops nothing else: while clients drive ``simple`` at concurrency 4,
loading (a) a Python model whose ``auto_complete_config`` takes seconds, (b) an ONNX model
of about 1 GiB of external data whose config the router completes from its graph, and
(c) a model from an S3 repository whose store answers every request seconds late,
fails none of ``simple``'s requests, keeps its p99 near the same run's without the load,
and leaves every worker its instances (docs/MODEL-MANAGEMENT.md, "Loading in parallel").

The router prepares loads on its repository agent's threads (router/repository/agent.py);
its loop only applies the results. Before that, the first load here stopped the loop for
its whole length: ``simple``'s requests failed with 503 and both workers were dropped."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import identity
from conveyor.deploy.ports import free_port
from tests.support.external_data_models import big_embedding
from tests.support.group import Server, router_control, start_server, wait_all_instances_ready
from tests.support.python_models import ADD_SUB_MODEL, write_model
from tests.support.serving_probe import Driver, add_sub_inputs, check_add_sub

LEVEL = "e2e"

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")
pytestmark = pytest.mark.timeout(300)

SLOW_S = 3.0  # the Python model's auto_complete_config
BRIEF_S = 2.0  # the same, for the load API's own tests
STORE_DELAY_S = 1.0  # each request to the slow S3 store
BIG_MIB = int(os.environ.get("CONVEYOR_BIG_ONNX_MIB", "1024"))  # weights in an external-data file
BASELINE_S = 2.0
# The p99 during a load may be twice the baseline's, or this much above it: on a busy 2-core
# machine the load's own work (a child process starting, a worker mapping a GiB) costs the
# clients some CPU, but never a stalled router (seconds).
P99_FLOOR_S = 0.1
WORKERS = 2

SIMPLE_CONFIG = """
name: "simple"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

# The hook sleeps, then notes when it ran (wall clock: the same in every process) beside the model.
SLOW_MODEL = '''
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        started = time.time()
        time.sleep({seconds})
        with open(os.path.join(os.path.dirname(__file__), "..", "hook-runs"), "a") as f:
            f.write(f"{{started}} {{time.time()}}\\n")
        config.add_input({{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}})
        config.add_output({{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}})
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
'''

# What a worker dropped or replaced says in the log: none of it may appear.
TROUBLE = ("stopped answering", "no word from the router", "left:", "request(s) lost", "saying hello again")


@dataclass
class Group:
    server: Server
    log: Path
    s3: object  # a boto3 client of the slow store
    slow_flag: Path


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    from tests.support.slow_s3 import slow_s3

    base = tmp_path_factory.mktemp("load_while_serving")
    repo = base / "repo"
    write_model(str(repo), "simple", ADD_SUB_MODEL, SIMPLE_CONFIG)
    for name, seconds in (("slow", SLOW_S), ("brief_a", BRIEF_S), ("brief_b", BRIEF_S)):
        write_model(str(repo), name, SLOW_MODEL.format(seconds=seconds), f'name: "{name}"\nbackend: "python"\n')
    big_data = big_embedding(str(repo), "big", BIG_MIB)
    flag = base / "slow-store"
    log = base / "server.log"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "CONVEYOR_REPOSITORY_CACHE": str(base / "cache")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    port = free_port()
    try:
        with slow_s3(port, STORE_DELAY_S, str(flag)) as url:
            s3 = boto3.client("s3", endpoint_url=url)
            s3.create_bucket(Bucket="models")
            # A repository that does not exist stops the start, as Triton's: the store's holds a file until
            # the test's model arrives (a file at the repository's root is no model).
            s3.put_object(Bucket="models", Key="repo/README", Body=b"models arrive during the test")
            srv = start_server(str(repo), f"lws{os.getpid()}", "--model-repository", f"s3://127.0.0.1:{port}/models/repo",
                               "--workers", str(WORKERS), "--grpc-ingress", "0", "--model-control-mode", "explicit",
                               "--load-model", "simple", "--log-file", str(log), grpc=False)
            try:
                wait_all_instances_ready(srv.group, "simple", WORKERS)
                yield Group(srv, log, s3, flag)
            finally:
                assert srv.stop() == 0
    finally:
        os.remove(big_data)  # the next runs need not keep a GiB
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def simple_instances(group: Group) -> list[tuple[int, int, str]]:
    return sorted((r["index"], r["worker_pid"], r["state"])
                  for r in router_control(group.server.group, "instances") if r["model"] == "simple")


def load_while_serving(group: Group, model: str, at_least_s: float,
                       check: Callable[[th.InferenceServerClient], None] = lambda _: None) -> None:
    """Drive ``simple`` at concurrency 4; measure a baseline, then load ``model`` and measure
    the load's span; check what the clients, the instances and the log saw."""
    before = simple_instances(group)
    assert len(before) == WORKERS and all(state == "READY" for _, _, state in before), before
    log_start = group.log.stat().st_size
    client = th.InferenceServerClient(group.server.http_url, network_timeout=300)
    with Driver(group.server.http_url, "simple", add_sub_inputs, check_add_sub, concurrency=4) as driver:
        driver.wait_calls(20)
        t0 = time.monotonic()
        time.sleep(BASELINE_S)
        t1 = time.monotonic()
        client.load_model(model)  # returns once the model is ready, as in Triton
        t2 = time.monotonic()
    baseline, during = driver.window(t0, t1), driver.window(t1, t2)
    print(f"\n{model}: load {t2 - t1:.1f}s; baseline {baseline}; during the load {during}")
    assert client.is_model_ready(model)
    assert t2 - t1 >= at_least_s * 0.9, f"the load of {model} was not slow: the test proves nothing"
    assert during.failed == [], during.failed[:5]
    assert during.calls >= 4 * (t2 - t1), f"simple was hardly served during the load: {during}"
    assert during.p99_s <= max(2 * baseline.p99_s, baseline.p99_s + P99_FLOOR_S), (baseline, during)
    assert simple_instances(group) == before, "simple's instances moved"
    with open(group.log, encoding="utf-8", errors="replace") as f:
        f.seek(log_start)
        trouble = [line for line in f if any(t in line for t in TROUBLE)]
    assert trouble == []
    check(client)
    client.unload_model(model)


def test_a_slow_auto_complete_config_stops_no_other_model(group: Group) -> None:
    load_while_serving(group, "slow", SLOW_S)


def test_a_gigabyte_onnx_model_stops_no_other_model(group: Group) -> None:
    # (Weights inside the graph are never read by the router either: tests/router/repository/test_onnx_graph.py.)
    def completed_from_the_graph(client: th.InferenceServerClient) -> None:
        config = client.get_model_config("big")
        assert [(t["name"], t["dims"]) for t in config["input"]] == [("I", [1])], config

    load_while_serving(group, "big", 0.0, completed_from_the_graph)


def test_a_slow_object_store_stops_no_other_model(group: Group, tmp_path: Path) -> None:
    staged = tmp_path / "staged"
    identity(str(staged), "cloudy", "FP32", 0, "-1")
    files = [p for p in staged.rglob("*") if p.is_file()]
    for path in files:
        group.s3.upload_file(str(path), "models", f"repo/{path.relative_to(staged)}")  # type: ignore[attr-defined]
    group.slow_flag.touch()
    try:
        # The mirror lists the store, then fetches each new file: every request waits STORE_DELAY_S.
        load_while_serving(group, "cloudy", STORE_DELAY_S * (1 + len(files)))
    finally:
        group.slow_flag.unlink()



# --- the load API while loads run in parallel ------------------------------------------


@dataclass
class Call:
    """A load or unload made on a thread of its own: when it returned, and how."""

    started: float = 0.0
    ended: float = 0.0
    error: str = ""

    @property
    def seconds(self) -> float:
        return self.ended - self.started


def hook_runs(group: Group, model: str) -> list[tuple[float, float]]:
    """When ``model``'s auto_complete_config ran: (start, end), wall clock, in order."""
    path = Path(group.server.repo) / model / "hook-runs"
    if not path.exists():
        return []
    runs = [line.split() for line in path.read_text().splitlines()]
    return sorted((float(start), float(end)) for start, end in runs)


def in_background(group: Group, op: str, model: str) -> tuple[threading.Thread, Call]:
    call = Call(time.monotonic())

    def run() -> None:
        client = th.InferenceServerClient(group.server.http_url, network_timeout=120)
        try:
            getattr(client, op)(model)
        except InferenceServerException as exc:
            call.error = str(exc)
        finally:
            call.ended = time.monotonic()
            client.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, call


def test_loads_of_different_models_run_in_parallel(group: Group) -> None:
    http = th.InferenceServerClient(group.server.http_url)
    runs_a, runs_b = len(hook_runs(group, "brief_a")), len(hook_runs(group, "brief_b"))
    (ta, a), (tb, b) = in_background(group, "load_model", "brief_a"), in_background(group, "load_model", "brief_b")
    time.sleep(1.0)
    index = {r["name"]: r for r in http.get_model_repository_index()}  # the repository is read meanwhile ...
    answered = time.time()  # (wall clock, as the hooks note theirs)
    assert "brief_a" in index
    assert http.is_server_live() and http.is_model_ready("simple")
    ta.join(60)
    tb.join(60)
    assert (a.error, b.error) == ("", "")
    assert http.is_model_ready("brief_a") and http.is_model_ready("brief_b")
    # Both completions ran at the same time (each in its child process, on a thread of the agent).
    [(a_start, a_end)], [(b_start, b_end)] = hook_runs(group, "brief_a")[runs_a:], hook_runs(group, "brief_b")[runs_b:]
    assert a_start < b_end and b_start < a_end, "the loads were prepared one after the other"
    assert answered < max(a_end, b_end), "the index waited for the loads"  # ... not after the loads
    http.unload_model("brief_a")
    http.unload_model("brief_b")


def test_a_second_load_of_a_model_waits_for_the_first(group: Group) -> None:
    runs = len(hook_runs(group, "brief_a"))
    first_thread, first = in_background(group, "load_model", "brief_a")
    time.sleep(0.5)
    second_thread, second = in_background(group, "load_model", "brief_a")
    first_thread.join(60)
    second_thread.join(60)
    assert (first.error, second.error) == ("", "")
    # The second read the model after the first was applied, and both were answered once the
    # model settled with what the second read (in the same loop turn: either may land first).
    [(_, first_end), (second_start, _)] = hook_runs(group, "brief_a")[runs:]
    assert second_start >= first_end, "the two loads of one model were prepared at the same time"
    assert abs(first.ended - second.ended) < 1.0, (first, second)
    http = th.InferenceServerClient(group.server.http_url)
    index = [(r["name"], r.get("version"), r.get("state")) for r in http.get_model_repository_index()
             if r["name"] == "brief_a"]
    assert index == [("brief_a", "1", "READY")]
    http.unload_model("brief_a")


def test_an_unload_during_a_load_cancels_it(group: Group) -> None:
    http = th.InferenceServerClient(group.server.http_url)
    load_thread, load = in_background(group, "load_model", "brief_b")
    time.sleep(1.0)
    started = time.monotonic()
    http.unload_model("brief_b")  # answered at once, not after the load
    assert time.monotonic() - started < 1.0
    load_thread.join(60)
    assert "failed to load 'brief_b': 'brief_b' was unloaded while it was loading" in load.error
    assert load.ended - started < 1.0, "the load call was answered only when its preparation ended"
    time.sleep(BRIEF_S)  # its preparation has ended by now: its result was dropped
    rows = {r["name"]: r for r in http.get_model_repository_index()}
    assert (rows["brief_b"]["state"], rows["brief_b"]["reason"]) == ("UNAVAILABLE", "unloaded")
    assert not http.is_model_ready("brief_b")
    http.load_model("brief_b")  # and a new load of it works
    assert http.is_model_ready("brief_b")
    http.unload_model("brief_b")
