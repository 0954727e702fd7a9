"""Triton's --model-namespacing: two repositories both hold a model ``m`` (one negates,
one does not) and an ensemble that uses ``m``. With the flag each ensemble runs its own
repository's ``m``, a request to ``m`` gets Triton's ambiguity error, and the index lists
both; without it the old rule holds (a name found twice is unavailable)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.ensembles.state import EnsembleVersion
from conveyor.router.lifecycle import ControlMode, ModelControlConfig, ModelLifecycle
from conveyor.router.registry import ModelRegistry
from conveyor.router.repository.scan import scan
from conveyor.router.spec.namespaces import assign_keys, step_key
from tests.support.ensemble_models import _step, ensemble, identity_int32
from tests.support.group import Server, start_server
from tests.support.metrics import metrics_text

LEVEL = "e2e"

pytestmark = pytest.mark.timeout(180)

AMBIGUOUS = ("There are 2 identifiers of model 'm' in global map, "
             "model namespace must be provided to resolve ambiguity.")


def build(root: Path) -> tuple[str, str]:
    """repository a: m (identity), ens_a (m), only_a; repository b: m (negation), ens_b (m)."""
    a, b = str(root / "a"), str(root / "b")
    for repo, op, ens in ((a, "Identity", "ens_a"), (b, "Neg", "ens_b")):
        identity_int32(repo, "m", op=op)
        ensemble(repo, ens, ["IN"], ["OUT"], [_step("m", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})])
    identity_int32(a, "only_a", op="Neg")
    return a, b


def test_keys_and_steps(tmp_path: Path) -> None:
    a, b = build(tmp_path)
    pairs = [("m", f"{a}/m"), ("ens_a", f"{a}/ens_a"), ("m", f"{b}/m")]
    assert assign_keys(pairs) == {f"{a}/m": f"{a}/m", "ens_a": f"{a}/ens_a", f"{b}/m": f"{b}/m"}
    namespaced = {"m": [f"{a}/m", f"{b}/m"]}
    assert step_key(f"{b}/ens_b", "m", namespaced) == f"{b}/m"  # its own repository's
    assert step_key(f"{a}/ens_a", "only_a", namespaced) == "only_a"  # a unique name is its key
    assert step_key("/elsewhere/e", "m", {"m": [f"{b}/m"]}) == f"{b}/m"  # the only one of that name
    specs = scan([a, b], namespacing=True)
    assert sorted(specs) == sorted([f"{a}/m", f"{b}/m", "ens_a", "ens_b", "only_a"])
    assert specs[f"{b}/m"].name == "m" and specs[f"{b}/m"].config.name == "m" and not specs[f"{b}/m"].error
    # Without the flag: the old rule, the name is unavailable.
    assert scan([a, b])["m"].error == "model appears in two or more repositories"


def test_registry_refuses_the_ambiguous_name(tmp_path: Path) -> None:
    a, b = build(tmp_path)
    registry = ModelRegistry()
    lifecycle = ModelLifecycle(registry, [a, b],
                               ModelControlConfig(ControlMode.EXPLICIT, ("m", "only_a"), namespacing=True))
    lifecycle.startup()
    assert sorted(registry.models) == sorted([f"{a}/m", f"{b}/m", "only_a"])  # --load-model m: both
    with pytest.raises(ConveyorError) as info:
        registry.entry("m")
    assert info.value.status is Status.INVALID_ARG and info.value.message == AMBIGUOUS
    assert registry.entry("only_a").spec.name == "only_a"
    lifecycle.check_control_allowed()
    lifecycle.unload("m")  # unloads every model of that name
    assert sorted(registry.models) == ["only_a"]
    assert [r["name"] for r in lifecycle.index(False)].count("m") == 2


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return build(tmp_path_factory.mktemp("namespaces"))


@pytest.fixture(scope="module")
def ns_server(repos: tuple[str, str]) -> Iterator[Server]:
    srv = start_server(repos[0], f"ns{os.getpid()}", "--model-repository", repos[1], "--workers", "1",
                       "--model-namespacing", "true")
    yield srv
    assert srv.stop() == 0


def _infer(protocol: Any, client: Any, model: str, x: np.ndarray, name: str = "IN") -> np.ndarray:
    inp = protocol.InferInput(name, list(x.shape), "INT32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp])
    out: np.ndarray = result.as_numpy("OUT" if name == "IN" else "OUTPUT0")
    return out


@pytest.mark.parametrize("protocol", [httpclient, grpcclient], ids=["http", "grpc"])
def test_each_ensemble_runs_its_own_repositorys_model(ns_server: Server, protocol: Any) -> None:
    client = protocol.InferenceServerClient(ns_server.http_url if protocol is httpclient else ns_server.grpc_url)
    x = np.arange(32, dtype=np.int32).reshape(2, 16)
    np.testing.assert_array_equal(_infer(protocol, client, "ens_a", x), x)
    np.testing.assert_array_equal(_infer(protocol, client, "ens_b", x), -x)
    np.testing.assert_array_equal(_infer(protocol, client, "only_a", x, "INPUT0"), -x)  # a unique name: as usual
    with pytest.raises(InferenceServerException) as info:
        _infer(protocol, client, "m", x, "INPUT0")
    assert AMBIGUOUS in str(info.value.message())
    assert info.value.status() == ("400" if protocol is httpclient else "StatusCode.INVALID_ARGUMENT")


def test_index_lists_both(ns_server: Server) -> None:
    client = httpclient.InferenceServerClient(ns_server.http_url)
    rows = [(r["name"], r.get("state")) for r in client.get_model_repository_index()]
    # Triton's order: by repository, then name.
    assert [name for name, _ in rows] == ["ens_a", "m", "only_a", "ens_b", "m"]
    assert all(state == "READY" for _, state in rows)
    assert not client.is_model_ready("m")


def test_without_the_flag_the_name_is_unavailable(repos: tuple[str, str]) -> None:
    srv = start_server(repos[0], f"nn{os.getpid()}", "--model-repository", repos[1], "--workers", "1")
    try:
        client = httpclient.InferenceServerClient(srv.http_url)
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert rows["m"]["state"] == "UNAVAILABLE"
        assert rows["m"]["reason"] == "model appears in two or more repositories"  # Triton's words
        assert not client.is_model_ready("ens_a") and client.is_model_ready("only_a")
    finally:
        assert srv.stop() == 0


def test_metrics_label_the_namespace(ns_server: Server, repos: tuple[str, str]) -> None:
    """Triton's ``namespace`` label: the model's repository."""
    client = httpclient.InferenceServerClient(ns_server.http_url)
    x = np.ones((1, 16), dtype=np.int32)
    _infer(httpclient, client, "ens_b", x)
    text = metrics_text(ns_server)
    for repo in repos:
        assert f'nv_inference_count{{model="m",namespace="{repo}",version="1"}}' in text
    assert f'nv_inference_count{{model="ens_b",namespace="{repos[1]}",version="1"}}' in text  # every model, as Triton


def test_poll_rekeys_when_a_second_repository_gains_the_name(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    identity_int32(a, "m")
    ensemble(a, "ens_a", ["IN"], ["OUT"], [_step("m", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})])
    os.makedirs(b)
    registry = ModelRegistry()
    lifecycle = ModelLifecycle(registry, [a, b], ModelControlConfig(ControlMode.POLL, namespacing=True))
    lifecycle.startup()
    assert sorted(registry.models) == ["ens_a", "m"]
    assert _steps(registry, "ens_a") == ["m"]
    identity_int32(b, "m", op="Neg")
    lifecycle.poll()
    assert sorted(registry.models) == sorted(["ens_a", f"{a}/m", f"{b}/m"])
    assert _steps(registry, "ens_a") == [f"{a}/m"]  # rebuilt: its step now runs its own repository's m


def _steps(registry: ModelRegistry, ensemble: str) -> list[str]:
    state = registry.models[ensemble].versions[1]
    assert isinstance(state, EnsembleVersion) and state.plan is not None
    return [s.model for s in state.plan.steps]
