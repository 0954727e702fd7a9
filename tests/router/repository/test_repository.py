"""Reading Triton model repositories: configs, versions, and models that are wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conveyor.deploy.example_repo import add_sub
from conveyor.proto.model_config import parse_text, to_json
from conveyor.router.repository.scan import scan

LEVEL = "unit"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_scan_finds_versions_by_policy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    add_sub(str(tmp_path), "m", 8)
    for v in (2, 3):
        os.makedirs(tmp_path / "m" / str(v))
        (tmp_path / "m" / str(v) / "model.onnx").write_bytes((tmp_path / "m" / "1" / "model.onnx").read_bytes())
    spec = scan([str(tmp_path)])["m"]
    assert spec.error == "" and list(spec.versions) == [3]  # latest 1 by default
    cfg = (tmp_path / "m" / "config.pbtxt").read_text()
    (tmp_path / "m" / "config.pbtxt").write_text(cfg + "\nversion_policy { all { } }\n")
    assert list(scan([str(tmp_path)])["m"].versions) == [1, 2, 3]
    (tmp_path / "m" / "config.pbtxt").write_text(cfg + "\nversion_policy { specific { versions: [1, 7] } }\n")
    spec = scan([str(tmp_path)])["m"]
    # As Triton's VersionsToLoad: a version the policy names without a folder is only logged, not a failure.
    assert list(spec.versions) == [1] and not spec.version_errors and not spec.error
    assert "version 7 is specified for model 'm', but the version directory is not present" in caplog.text
    (tmp_path / "m" / "config.pbtxt").write_text(cfg + "\nversion_policy { specific { versions: [7] } }\n")
    assert scan([str(tmp_path)])["m"].error == ("at least one version must be available under the version "
                                                 "policy of model 'm'")


def test_version_folders_as_triton_reads_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A folder with a leading zero or that is no number is no version, with Triton's warnings (L0_lifecycle's
    test_parse_ignore_zero_prefixed_version and test_parse_ignore_non_intergral_version grep them)."""
    add_sub(str(tmp_path), "m", 8)
    os.rename(tmp_path / "m" / "1", tmp_path / "m" / "003")
    for folder in ("abc", "warmup", "configs", "2"):
        os.makedirs(tmp_path / "m" / folder)
    (tmp_path / "m" / "2" / "model.onnx").write_bytes((tmp_path / "m" / "003" / "model.onnx").read_bytes())
    cfg = (tmp_path / "m" / "config.pbtxt").read_text()
    (tmp_path / "m" / "config.pbtxt").write_text(cfg + "\nversion_policy { all { } }\n")
    spec = scan([str(tmp_path)])["m"]
    assert list(spec.versions) == [2] and not spec.version_errors
    assert "ignore version directory '003' which contains leading zeros in its directory name" in caplog.text
    assert "ignore version directory 'abc' which fails to convert to integral number" in caplog.text
    assert "'warmup'" not in caplog.text and "'configs'" not in caplog.text


def test_bad_models_say_why(tmp_path: Path) -> None:
    write(tmp_path / "broken" / "config.pbtxt", "max_batch_size: [")
    write(tmp_path / "noconfig" / "1" / "model.onnx", "")
    write(tmp_path / "wrongname" / "config.pbtxt", 'name: "other"\nbackend: "python"')
    write(tmp_path / "noinputs" / "config.pbtxt", 'platform: "onnxruntime_onnx"')
    write(tmp_path / "caffe2" / "config.pbtxt",  # a platform Triton dropped: no Conveyor backend serves it
          'platform: "caffe2_netdef" input [{name: "a" data_type: TYPE_FP32 dims: [1]}] '
          'output [{name: "b" data_type: TYPE_FP32 dims: [1]}]')
    specs = scan([str(tmp_path)])
    assert "failed to parse" in specs["broken"].error
    assert "at least one output" in specs["noconfig"].error  # an empty model.onnx completes to nothing
    assert "directory name must equal model name" in specs["wrongname"].error and specs["wrongname"].poll_failed
    assert "at least one output" in specs["noinputs"].error  # no inputs is allowed, as Triton
    assert "not supported" in specs["caffe2"].error


def test_config_json_matches_triton_form() -> None:
    config = parse_text(
        'name: "m" max_batch_size: 8 input [{name: "A" data_type: TYPE_INT32 dims: [16]}] '
        'dynamic_batching { preferred_batch_size: [4] max_queue_delay_microseconds: 100 }'
    )
    d = to_json(config)
    assert d["max_batch_size"] == 8
    assert d["input"][0]["dims"] == [16]  # numbers, not protobuf's quoted int64
    assert d["input"][0]["data_type"] == "TYPE_INT32"
    assert d["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert d["dynamic_batching"]["preferred_batch_size"] == [4]


def test_onnx_config_is_completed_from_the_graph(tmp_path: Path) -> None:
    add_sub(str(tmp_path), "batched", 8)
    add_sub(str(tmp_path), "plain", 0)
    (tmp_path / "batched" / "config.pbtxt").unlink()
    (tmp_path / "plain" / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 0\n')
    specs = scan([str(tmp_path)])
    batched, plain = specs["batched"].config, specs["plain"].config
    assert specs["batched"].error == "" and list(specs["batched"].versions) == [1]
    assert batched.max_batch_size == 4 and batched.HasField("dynamic_batching")
    assert [(i.name, list(i.dims)) for i in batched.input] == [("INPUT0", [16]), ("INPUT1", [16])]
    assert [o.name for o in batched.output] == ["OUTPUT0", "OUTPUT1"]
    assert specs["plain"].error == "" and plain.max_batch_size == 0
    assert [list(i.dims) for i in plain.input] == [[16], [16]]


def test_torchscript_and_tensorrt_configs_are_not_completed(tmp_path: Path) -> None:
    write(tmp_path / "pt_noconfig" / "1" / "model.pt", "")
    write(tmp_path / "pt_noinputs" / "config.pbtxt", 'backend: "pytorch"')
    write(tmp_path / "pt_noinputs" / "1" / "model.pt", "")
    write(tmp_path / "plan_noinputs" / "config.pbtxt", 'platform: "tensorrt_plan"')
    write(tmp_path / "plan_noinputs" / "1" / "model.plan", "")
    specs = scan([str(tmp_path)])
    for name in ("pt_noconfig", "pt_noinputs"):
        assert specs[name].backend == "pytorch"  # recognised by its model.pt, as Triton does
        assert "at least one output" in specs[name].error and "must declare its inputs and outputs" in specs[name].error
    assert "does not complete TensorRT configs" in specs["plan_noinputs"].error


def test_default_model_filename_is_honoured(tmp_path: Path) -> None:
    write(tmp_path / "m" / "config.pbtxt",
          'platform: "pytorch_libtorch" default_model_filename: "traced.pt" '
          'input [{name: "INPUT__0" data_type: TYPE_FP32 dims: [1]}] '
          'output [{name: "OUTPUT__0" data_type: TYPE_FP32 dims: [1]}]')
    write(tmp_path / "m" / "1" / "traced.pt", "")
    spec = scan([str(tmp_path)])["m"]
    assert spec.error == "" and spec.versions[1].endswith("/1/traced.pt")


def test_onnx_model_directory_with_external_data_is_completed(tmp_path: Path) -> None:
    from tests.support import external_data_models as ext

    model_dir = ext.model_directory(str(tmp_path), "big")  # no config.pbtxt
    os.remove(os.path.join(model_dir, ext.WEIGHTS))  # completion reads the graph only, never the weights
    spec = scan([str(tmp_path)])["big"]
    assert spec.error == "" and spec.backend == "onnxruntime" and spec.config.platform == "onnxruntime_onnx"
    assert spec.versions == {1: model_dir}  # the worker's backend opens model.onnx inside it
    assert spec.config.max_batch_size == 4 and spec.config.HasField("dynamic_batching")
    assert [(i.name, list(i.dims)) for i in spec.config.input] == [("X", [4])]  # initializers W, B are not inputs
    assert [(o.name, list(o.dims)) for o in spec.config.output] == [("Y", [4])]


def test_onnx_model_directory_without_model_onnx_says_so(tmp_path: Path) -> None:
    from tests.support import external_data_models as ext

    model_dir = ext.model_directory(str(tmp_path), "big", 'platform: "onnxruntime_onnx"\n' + ext.CONFIG)
    os.rename(os.path.join(model_dir, "model.onnx"), os.path.join(model_dir, "graph.onnx"))
    spec = scan([str(tmp_path)])["big"]
    assert spec.versions == {} and spec.version_errors[1] == f"model directory '{model_dir}' holds no 'model.onnx'"
