"""``conveyor.torch_compile``: TorchScript models compiled with torch.compile at load.

Compiling is slow, so the models are tiny and the backend is ``aot_eager`` (no C++
compiler needed); ``inductor`` runs only where a C++ compiler is found."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.model_config import parse_text
from conveyor.workers.backends import load_backend
from conveyor.workers.backends.pytorch.compile_settings import CompileSettings

LEVEL = "slow"  # torch.compile: seconds per graph


def _settings(**parameters: str) -> CompileSettings:
    config = mc.ModelConfig()
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    return CompileSettings.from_config(config)


def test_compile_settings_from_parameters() -> None:
    assert not CompileSettings.from_config(mc.ModelConfig()).enabled
    s = _settings(**{"conveyor.torch_compile": "auto", "conveyor.torch_compile_mode": "max-autotune",
                     "conveyor.torch_compile_dynamic": "false"})
    assert (s.when, s.backend, s.mode, s.dynamic) == ("auto", "inductor", "max-autotune", False)
    # Triton's model.py-runtime options are read, but alone they compile nothing.
    triton = '{"backend": "aot_eager", "dynamic": true, "fullgraph": true}'
    s = _settings(TORCH_COMPILE_OPTIONAL_PARAMETERS=triton)
    assert not s.enabled and (s.backend, s.dynamic, s.fullgraph) == ("aot_eager", True, True)
    s = _settings(**{"conveyor.torch_compile": "true", "TORCH_COMPILE_OPTIONAL_PARAMETERS": '{"disable": true}'})
    assert not s.enabled  # torch.compile(disable=True) is a no-op
    refused = {
        (("conveyor.torch_compile", "maybe"),): "must be true, false or auto",
        (("conveyor.torch_compile_dynamic", "sometimes"),): "must be true or false",
        (("TORCH_COMPILE_OPTIONAL_PARAMETERS", "[1]"),): "must be a JSON object",
        (("TORCH_COMPILE_OPTIONAL_PARAMETERS", "{nope"),): "must be a JSON object",
        (("TORCH_COMPILE_OPTIONAL_PARAMETERS", '{"model": 1}'),): "takes no 'model'",
        (("TORCH_COMPILE_OPTIONAL_PARAMETERS", '{"dynamic": "yes"}'),): "'dynamic' must be a JSON boolean",
        (("conveyor.torch_compile_backend", "eager"), ("TORCH_COMPILE_OPTIONAL_PARAMETERS", '{"backend": "x"}')):
            "disagree",
        (("conveyor.torch_compile_mode", "default"), ("TORCH_COMPILE_OPTIONAL_PARAMETERS", '{"options": {"a": 1}}')):
            "a mode or options",
    }
    for pairs, match in refused.items():
        with pytest.raises(ConveyorError, match=match) as info:
            _settings(**dict(pairs))
        assert info.value.status == Status.INVALID_ARG
    with pytest.raises(ConveyorError, match="no backend 'nope'"):
        CompileSettings(when="on", backend="nope").check(["inductor", "eager"], ["default"])
    with pytest.raises(ConveyorError, match="inductor backend only"):
        CompileSettings(when="on", backend="eager", mode="default").check(["inductor", "eager"], ["default"])
    with pytest.raises(ConveyorError, match="must be one of default, max-autotune"):
        CompileSettings(when="on", mode="fast").check(["inductor"], ["max-autotune", "default"])


# --- with torch -------------------------------------------------------------------------------

def _load(tmp_path: Path, module: Any, config: str) -> Any:
    from tests.support import torch_models

    path = torch_models.save(module, str(tmp_path), "m", config)
    return load_backend("pytorch", path, parse_text(config), "cpu")


def _graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def test_compiled_answers_as_the_torchscript_module_and_requests_do_not_compile(
        tmp_path: Path, torch_models: Any) -> None:
    import torch

    module = torch.jit.script(torch_models.Mlp())
    backend = _load(tmp_path, module, torch_models.MLP_CONFIG.format(name="m", extra=torch_models.compile_parameters()))
    assert backend.compiled
    compiled_at_load = _graphs_compiled()
    for rows in (1, 5, 8, 2):  # batch 1 and any other size were compiled at load
        x = np.random.default_rng(rows).random((rows, 4), dtype=np.float32)
        out = backend.execute({"INPUT__0": x}, ["OUTPUT__0", "OUTPUT__1"])
        with torch.no_grad():
            want = module(torch.from_numpy(x))
        np.testing.assert_allclose(out["OUTPUT__0"], want[0].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["OUTPUT__1"], want[1].numpy(), rtol=1e-5, atol=1e-6)
    assert _graphs_compiled() == compiled_at_load


def test_dict_input_compiles_with_dynamic_shapes(tmp_path: Path, torch_models: Any) -> None:
    import torch

    config = ('platform: "pytorch_libtorch" input [{ name: "A" data_type: TYPE_INT64 dims: [-1] },'
              '{ name: "B" data_type: TYPE_INT64 dims: [-1] }] output [{ name: "S" data_type: TYPE_INT64 dims: [-1] }] '
              + torch_models.compile_parameters(dynamic="true"))
    backend = _load(tmp_path, torch.jit.script(torch_models.DictSum()), config)
    assert backend.compiled
    a, b = np.arange(7), np.arange(7) * 3
    np.testing.assert_array_equal(backend.execute({"A": a, "B": b}, ["S"])["S"], a + 10 * b)


def test_a_model_that_cannot_compile_fails_the_load_or_with_auto_serves_uncompiled(
        tmp_path: Path, torch_models: Any, caplog: pytest.LogCaptureFixture) -> None:
    import torch

    loop = torch.jit.script(torch_models.DoubleUntil())
    strict = torch_models.LOOP_CONFIG.format(name="m", extra=torch_models.compile_parameters("true"))
    with pytest.raises(ConveyorError, match=r"could not convert the TorchScript module .*prim::Loop.*'auto' would") \
            as info:
        _load(tmp_path / "strict", loop, strict)
    assert info.value.status == Status.UNAVAILABLE
    with caplog.at_level("WARNING", logger="conveyor.workers.backends.pytorch.backend"):
        backend = _load(tmp_path / "auto", loop, strict.replace('"true"', '"auto"'))
    assert not backend.compiled
    assert "serving the TorchScript model uncompiled" in caplog.text and "prim::Loop" in caplog.text
    out = backend.execute({"INPUT__0": np.ones(3, dtype=np.float32)}, ["OUTPUT__0"])
    np.testing.assert_array_equal(out["OUTPUT__0"], np.full(3, 63, dtype=np.float32))


def test_string_models_are_not_compiled(tmp_path: Path, torch_models: Any) -> None:
    import torch

    config = torch_models.UPPER_CONFIG + torch_models.compile_parameters("true")
    with pytest.raises(ConveyorError, match="'INPUT__0' is TYPE_STRING"):
        _load(tmp_path, torch.jit.script(torch_models.Upper()), config)


def test_bad_compile_parameters_are_refused_at_load(tmp_path: Path, torch_models: Any) -> None:
    import torch

    script = torch.jit.script(torch_models.AddSub())
    cases = {
        torch_models.compile_parameters(backend="no_such_backend"): "torch.compile has no backend 'no_such_backend'",
        torch_models.compile_parameters(backend="inductor", mode="fastest"): "must be one of default",
        torch_models.compile_parameters(mode="max-autotune"): "inductor backend only, not 'aot_eager'",
    }
    for i, (parameters, match) in enumerate(cases.items()):
        with pytest.raises(ConveyorError, match=match) as info:
            _load(tmp_path / str(i), script, torch_models.ADD_SUB_CONFIG.format(name="m", extra=parameters))
        assert info.value.status == Status.INVALID_ARG


def test_a_compiled_graph_that_answers_differently_fails_the_load(tmp_path: Path, torch_models: Any) -> None:
    import torch
    from torch._dynamo import register_backend

    @register_backend(name="conveyor_test_off_by_one")
    def off_by_one(graph: Any, example_inputs: Any) -> Any:  # a broken compiler
        return lambda *args: [t + 1 for t in graph(*args)]

    config = torch_models.ADD_SUB_CONFIG.format(name="m", extra=torch_models.compile_parameters(
        backend="conveyor_test_off_by_one"))
    with pytest.raises(ConveyorError, match="output 0 differs from the TorchScript module's on inputs of shapes"):
        _load(tmp_path, torch.jit.script(torch_models.AddSub()), config)


def _cxx() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


@pytest.mark.skipif(_cxx() is None, reason="inductor needs a C++ compiler on the CPU")
def test_inductor_compiles_where_a_cxx_compiler_is(tmp_path: Path, torch_models: Any) -> None:
    import torch

    config = torch_models.ADD_SUB_CONFIG.format(name="m", extra=torch_models.compile_parameters(
        backend="inductor", dynamic="false"))
    backend = _load(tmp_path, torch.jit.script(torch_models.AddSub()), config)
    assert backend.compiled
    a, b = np.arange(16, dtype=np.float32), np.full(16, 0.25, dtype=np.float32)
    out = backend.execute({"INPUT__0": a, "INPUT__1": b}, ["OUTPUT__0", "OUTPUT__1"])
    np.testing.assert_array_equal(out["OUTPUT__0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT__1"], a - b)


def test_inductor_without_a_cxx_compiler_says_so(
        tmp_path: Path, torch_models: Any, caplog: pytest.LogCaptureFixture) -> None:
    import torch
    import torch._inductor.config

    config = torch_models.ADD_SUB_CONFIG.format(name="m", extra=torch_models.compile_parameters(
        "auto", backend="inductor", dynamic="false"))
    # No compiler where inductor looks, and no cached kernels to fall back on.
    no_cxx = {"cpp.cxx": (None, str(tmp_path / "no-such-c++")), "fx_graph_cache": False}
    with caplog.at_level("WARNING", logger="conveyor.workers.backends.pytorch.backend"), \
            torch._inductor.config.patch(no_cxx):
        backend = _load(tmp_path, torch.jit.script(torch_models.AddSub()), config)
    assert not backend.compiled and "No working C++ compiler" in caplog.text
    x = np.ones(16, dtype=np.float32)
    np.testing.assert_array_equal(backend.execute({"INPUT__0": x, "INPUT__1": x}, ["OUTPUT__0"])["OUTPUT__0"], 2 * x)
