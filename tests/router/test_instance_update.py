"""Triton's instance update, on a real group (explicit mode, two workers): a load whose config changes only
``instance_group`` adds and removes instances in place (Triton's L0_model_update). Clients drive the model
throughout and none of their requests fails; the instances kept are never initialized again; the removed
ones' ``finalize`` has run when the load call returns; an added instance that cannot load undoes the update,
and the model serves as it was. A model whose files changed reloads whole, as in Triton.

Each instance notes ``init <name> <instance>`` and ``fini ...`` in a log beside the repository (one short
``O_APPEND`` write: whole lines, whichever thread or process writes)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import add_sub
from tests.support.group import Server, start_server
from tests.support.python_models import write_model

LEVEL = "e2e"

pytestmark = pytest.mark.timeout(300)
CALL_TIMEOUT_S = 120.0  # a load of a few Python instances on a loaded 2-core machine
CLIENTS = 3  # threads driving the model through every update
NAME = "counted"

MODEL = '''
import os
import uuid
import numpy as np
import triton_python_backend_utils as pb_utils

LOG = LOG_PATH


def note(what, args):
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{what} {args['model_instance_name']} {args['ident']}\\n".encode())
    finally:
        os.close(fd)


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args, ident=uuid.uuid4().hex)
        note("init", self.args)

    def execute(self, requests):
        name = np.array([self.args["model_instance_name"].encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(
            r, "IN").as_numpy()), pb_utils.Tensor("WHO", name)]) for r in requests]

    def finalize(self):
        note("fini", self.args)
'''


def config(groups: str, more: str = "") -> str:
    return (f'name: "{NAME}"\nbackend: "python"\n'
            'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }, '
            '{ name: "WHO" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
            f"instance_group [ {groups} ]\n{more}")


def cpu(count: int) -> str:
    return f"{{ count: {count} kind: KIND_CPU }}"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("update") / "models"
    root.mkdir()
    write_model(str(root), NAME, MODEL.replace("LOG_PATH", repr(str(root.parent / "lifecycle.log"))), config(cpu(2)))
    return root


@pytest.fixture(scope="module")
def srv(repo: Path) -> Iterator[Server]:
    server = start_server(str(repo), f"iu{os.getpid()}", "--workers", "2", "--model-control-mode", "explicit",
                          grpc=False)
    try:
        yield server
    finally:
        assert server.stop() == 0


@pytest.fixture
def client(srv: Server) -> Iterator[th.InferenceServerClient]:
    c = th.InferenceServerClient(f"127.0.0.1:{srv.http_port}", network_timeout=CALL_TIMEOUT_S,
                                 connection_timeout=CALL_TIMEOUT_S)
    yield c
    c.close()


def events(repo: Path) -> list[tuple[str, str]]:
    """(init|fini, the instance's own id) of every line so far."""
    log = repo.parent / "lifecycle.log"
    if not log.exists():
        return []
    return [(w, ident) for w, name, ident in (line.split() for line in log.read_text().splitlines())
            if name.startswith(NAME)]


def counts(repo: Path) -> tuple[int, int]:
    seen = events(repo)
    return sum(w == "init" for w, _ in seen), sum(w == "fini" for w, _ in seen)


def infer(client: th.InferenceServerClient, **sequence: int | bool) -> str:
    data = np.arange(4, dtype=np.float32)
    inp = th.InferInput("IN", [4], "FP32")
    inp.set_data_from_numpy(data)
    result = client.infer(NAME, [inp], **sequence)
    np.testing.assert_array_equal(result.as_numpy("OUT"), data)
    who = result.as_numpy("WHO")
    assert who is not None
    return bytes(who[0]).decode()


class Drive:
    """Clients calling the model until stopped; every call must be answered right."""

    def __init__(self, srv: Server) -> None:
        self.srv = srv
        self.stop = threading.Event()
        self.answered = 0
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run) for _ in range(CLIENTS)]

    def _run(self) -> None:
        c = th.InferenceServerClient(f"127.0.0.1:{self.srv.http_port}", network_timeout=CALL_TIMEOUT_S)
        try:
            while not self.stop.is_set():
                try:
                    infer(c)
                    self.answered += 1
                except Exception as exc:  # every failure is the test's finding
                    self.errors.append(str(exc))
        finally:
            c.close()

    def __enter__(self) -> Drive:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(CALL_TIMEOUT_S)


def reload(repo: Path, client: th.InferenceServerClient, groups: str, more: str = "") -> None:
    (repo / NAME / "config.pbtxt").write_text(config(groups, more))
    client.load_model(NAME)


def unload(repo: Path, client: th.InferenceServerClient) -> None:
    client.unload_model(NAME)
    while counts(repo)[1] < counts(repo)[0]:  # an unload is answered at once; its finalizes follow
        threading.Event().wait(0.1)


def test_instance_count_changes_in_place_while_serving(srv: Server, repo: Path,
                                                       client: th.InferenceServerClient) -> None:
    client.load_model(NAME)
    assert counts(repo) == (2, 0)
    first = {ident for _, ident in events(repo)}
    with Drive(srv) as drive:
        reload(repo, client, cpu(4))  # two added
        assert counts(repo) == (4, 0)
        reload(repo, client, cpu(1))  # three removed: finalized by the time the load answers
        assert counts(repo) == (4, 3)
        reload(repo, client, cpu(1))  # nothing changed
        assert counts(repo) == (4, 3)
        reload(repo, client, cpu(3))
        assert counts(repo) == (6, 3)
        served_during = drive.answered
    assert drive.errors == []
    assert served_during > 0
    inits = [ident for w, ident in events(repo) if w == "init"]
    assert len(set(inits)) == len(inits)  # no instance initialized twice
    # The one instance left of the first two was never touched: one init, no fini.
    fini = {ident for w, ident in events(repo) if w == "fini"}
    assert len(first - fini) == 1
    assert infer(client)
    unload(repo, client)
    assert counts(repo) == (6, 6)


def test_an_added_instance_that_fails_undoes_the_update(srv: Server, repo: Path,
                                                        client: th.InferenceServerClient) -> None:
    reload(repo, client, cpu(2))
    before = counts(repo)
    # A GPU instance no worker here can host (or, on a GPU host, one on a GPU that does not exist).
    with pytest.raises(InferenceServerException) as err:
        reload(repo, client, f"{cpu(2)}, {{ count: 1 kind: KIND_GPU gpus: [ 63 ] }}")
    assert f"load failed for model '{NAME}': version 1 is at READY state: " in err.value.message()
    assert counts(repo) == before  # the two CPU instances were never touched
    assert client.is_model_ready(NAME)
    assert infer(client)
    config_now = client.get_model_config(NAME)
    assert [g["count"] for g in config_now["instance_group"]] == [2]  # the config that serves
    unload(repo, client)


def test_a_changed_model_file_reloads_every_instance(srv: Server, repo: Path,
                                                     client: th.InferenceServerClient) -> None:
    reload(repo, client, cpu(2))
    before = counts(repo)
    with open(repo / NAME / "1" / "model.py", "a", encoding="utf-8") as f:
        f.write("\n# changed\n")
    reload(repo, client, cpu(3))
    assert counts(repo)[0] == before[0] + 3  # Triton's reload: every instance made anew
    unload(repo, client)


def test_a_removed_instance_runs_its_sequences_to_their_end(srv: Server, repo: Path,
                                                          client: th.InferenceServerClient) -> None:
    """As Triton's: an instance an update removes while it holds a sequence serves it to its end, then goes;
    the update's call does not wait for it."""
    direct = "sequence_batching { direct { } max_sequence_idle_microseconds: 60000000 }\n"
    reload(repo, client, cpu(3), direct)
    inits, finis = counts(repo)
    first = infer(client, sequence_id=1, sequence_start=True)
    second = infer(client, sequence_id=2, sequence_start=True)
    assert first != second  # each sequence has an instance of its own
    # One instance is kept: the one that holds no sequence goes at once, a removed one holding a sequence stays.
    reload(repo, client, cpu(1), direct)
    assert counts(repo) == (inits, finis + 1)
    assert infer(client, sequence_id=1) == first
    assert infer(client, sequence_id=2) == second
    assert counts(repo) == (inits, finis + 1)
    assert infer(client, sequence_id=2, sequence_end=True) == second
    assert infer(client, sequence_id=1, sequence_end=True) == first
    while counts(repo)[1] < finis + 2:  # its sequence ended: it goes
        threading.Event().wait(0.1)
    assert infer(client, sequence_id=3, sequence_start=True, sequence_end=True) in (first, second)
    assert counts(repo) == (inits, finis + 2)
    unload(repo, client)


VERSIONED = "versioned"


def versioned_config(versions: str) -> str:
    return config(cpu(1)).replace(f'name: "{NAME}"', f'name: "{VERSIONED}"') + (
        f"version_policy: {{ specific: {{ versions: [ {versions} ] }} }}\n")


def version_events(repo: Path) -> list[tuple[str, str, str]]:
    """(init|fini, version, the instance's id) of the versioned model's lines."""
    log = repo.parent / "lifecycle.log"
    return [(w, name.rsplit("@", 1)[1], ident) for w, name, ident in (line.split() for line in
                                                                    log.read_text().splitlines())
            if name.startswith(VERSIONED)]


def test_a_reload_loads_only_the_versions_whose_files_changed(srv: Server, repo: Path,
                                                             client: th.InferenceServerClient) -> None:
    """Triton's per-version reload (L0_lifecycle's load_new_model_version): a version whose own files are unchanged
    keeps serving untouched, a changed or new one loads; a changed file every version shares reloads them all."""
    model = repo / VERSIONED
    tagged = MODEL.replace("LOG_PATH", repr(str(repo.parent / "lifecycle.log"))).replace(
        "args['model_instance_name']", "args['model_instance_name'] + '@' + args['model_version']")
    for v in (1, 2, 3):
        (model / str(v)).mkdir(parents=True)
        (model / str(v) / "model.py").write_text(tagged)
    (model / "config.pbtxt").write_text(versioned_config("1, 2"))
    client.load_model(VERSIONED)
    assert sorted(v for w, v, _ in version_events(repo) if w == "init") == ["1", "2"]
    first = {v: ident for _, v, ident in version_events(repo)}
    os.utime(model / "2" / "model.py", ns=(1, 1))  # version 2's file changed
    (model / "4").mkdir()
    (model / "4" / "model.py").write_text(tagged)
    (model / "config.pbtxt").write_text(versioned_config("1, 2, 3, 4"))
    client.load_model(VERSIONED)
    assert all(client.is_model_ready(VERSIONED, str(v)) for v in (1, 2, 3, 4))
    inits = [v for w, v, _ in version_events(repo) if w == "init"]
    assert sorted(inits) == ["1", "2", "2", "3", "4"]  # version 1 was never loaded again
    assert ("fini", "1", first["1"]) not in version_events(repo)
    (model / "dummy_dependency.py").write_text("# what every version imports\n")
    client.load_model(VERSIONED)
    assert sorted(v for w, v, _ in version_events(repo) if w == "init") == ["1", "1", "2", "2", "2", "3", "3",
                                                                             "4", "4"]
    client.unload_model(VERSIONED)


def test_a_group_without_count_loads_again_unchanged(srv: Server, repo: Path,
                                                    client: th.InferenceServerClient) -> None:
    """An onnxruntime model's KIND_CPU group without a count is two instances (Triton's default count); loading
    it again unchanged (qa/L0_response_cache loads an ensemble, then its composing model) keeps them serving."""
    add_sub(str(repo), "default_count", 8, "instance_group [ { kind: KIND_CPU } ]")
    for _ in range(2):
        client.load_model("default_count")
        assert client.is_model_ready("default_count")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [th.InferInput("INPUT0", [1, 16], "INT32"), th.InferInput("INPUT1", [1, 16], "INT32")]
    for inp in inputs:
        inp.set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer("default_count", inputs).as_numpy("OUTPUT0"), a + a)
    client.unload_model("default_count")
