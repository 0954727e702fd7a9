"""Triton's config checks (core's model_config_utils.cc) in its words, as Triton's L0_model_config expects them in
the server log (its noautofill_platform and ensemble cases)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.deploy.cli import strict_config_warnings
from conveyor.proto.model_config import parse_text
from conveyor.router.observability.histograms import uncustomizable_families
from conveyor.router.repository.scan import load_spec
from conveyor.router.spec.triton_rules import config_problem, instance_group_problem, io_problem
from conveyor.router.spec.validate import validate

LEVEL = "unit"

_IO = ('input [{ name: "input" data_type: TYPE_FP32 dims: [ 4 ] }]\n'
       'output [{ name: "output" data_type: TYPE_FP32 dims: [ 4 ] }]\n')


def _config(text: str, io: str = _IO) -> str:
    return f'name: "m"\nplatform: "onnxruntime_onnx"\nbackend: "onnxruntime"\n{text}\n{io}'


@pytest.mark.parametrize(("text", "problem"), [
    ("max_batch_size: -1", "'max_batch_size' must be non-negative value for m"),
    ("max_batch_size: 4\ndynamic_batching { priority_levels: 3 }",
     "default priority level must be in range [1, 3] for m"),
    ("ensemble_scheduling { step [{ model_name: 'a' model_version: -1 }] }",
     "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble"),
    ('sequence_batching { control_input [{ name: "S" control [{ kind: CONTROL_SEQUENCE_READY }] }] }',
     "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for "
     "CONTROL_SEQUENCE_READY for m"),
    ('sequence_batching { control_input [{ name: "S" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: '
     '[0, 1] }] }, { name: "S" control [{ kind: CONTROL_SEQUENCE_END int32_false_true: [0, 1] }] }] }',
     "sequence batching control tensor 'S' is specified for multiple control kinds for m"),
    ('sequence_batching { control_input [{ name: "C" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 '
     '}] }] }', "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are TYPE_UINT64, "
     "TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"),
    ("max_batch_size: 0", ""),
])
def test_config_problem(text: str, problem: str) -> None:
    assert config_problem(parse_text(_config(text))) == problem


def test_an_ensemble_needs_its_scheduling() -> None:
    config = parse_text('name: "e"\nplatform: "ensemble"')
    assert config_problem(config) == "ensemble scheduling must be set for ensemble e whose platform is ensemble"
    config.backend = "onnxruntime"
    assert config_problem(config) == "Ensemble model 'e' must have platform type 'ensemble' and empty backend type"


@pytest.mark.parametrize(("io", "problem"), [
    ('input [{ name: "input" dims: [ 4 ] }]', "model input 'input' must specify 'data_type' for m"),
    ('output [{ name: "output" data_type: TYPE_FP32 dims: [ 1, 0 ] }]',
     "model output 'output' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for m"),
    ('input [{ name: "input" data_type: TYPE_FP32 dims: [ 4, 4 ] reshape { shape: [ 2, 2 ] } }]',
     "model input 'input' has different size for dims and reshape for m"),
    ('input [{ name: "input" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape { shape: [ -1, 2, -1 ] } }]',
     "model input 'input' has different number of variable-size dimensions for dims and reshape for m"),
    ('input [{ name: "input" data_type: TYPE_FP32 dims: [ 2, -1, 3 ] reshape { shape: [ 1, 2, -1, 3 ] } }]', ""),
    ('output [{ name: "output" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } }]',
     "model output 'output' cannot have empty reshape for non-batching model as scalar tensors are not supported "
     "for m"),
    ('input [{ name: "input" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ 0 ] } }]',
     "model input 'input' reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension "
     "for m"),
    ('input [{ name: "input" data_type: TYPE_FP32 dims: [ 1 ] }]\nbatch_input [{ kind: BATCH_ELEMENT_COUNT '
     'target_name: "b" data_type: TYPE_FP32 }]', "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, "
     "got 0 for m"),
])
def test_io_problem(io: str, problem: str) -> None:
    config = parse_text(_config("", io))
    assert io_problem(config) == problem


def test_a_cpu_group_with_gpus_is_refused_by_its_normalized_name() -> None:
    config = parse_text(_config("instance_group [{ kind: KIND_CPU }, { kind: KIND_CPU gpus: [ 0 ] }]"))
    assert instance_group_problem(config) == ("instance group m_1 of model m has kind KIND_CPU but specifies one or "
                                              "more GPUs")


def test_validate_says_tritons_words_first() -> None:
    assert validate(parse_text(_config("max_batch_size: -2"))) == "'max_batch_size' must be non-negative value for m"


def _ensemble(steps: str, inputs: str = "data", outputs: str = "prob") -> str:
    return ('name: "e"\nplatform: "ensemble"\nmax_batch_size: 4\n'
            + "".join(f'input [{{ name: "{n}" data_type: TYPE_FP32 dims: [ 1 ] }}]\n' for n in inputs.split())
            + "".join(f'output [{{ name: "{n}" data_type: TYPE_FP32 dims: [ 1 ] }}]\n' for n in outputs.split())
            + f"ensemble_scheduling {{ step [ {steps} ] }}")


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {ins} {outs} }}'


@pytest.mark.parametrize(("steps", "inputs", "outputs", "problem"), [
    (f'{_step("a", {"X": "data"}, {"Y": "prob"})}, {{ model_name: "b" }}', "data", "prob",
     "must specify 'input_map' in step 1 of ensemble 'e'"),
    (f'{_step("a", {"X": "data"}, {"Y": "t"})}, {_step("b", {"X": "t"}, {"Y": "t"})}', "data", "t",
     "ensemble tensor 't' can appear in an output map only once for ensemble 'e' step 1"),
    (_step("a", {"X": "data"}, {"Y": "prob"}), "data data_2", "prob",
     "ensemble input 'data_2' for ensemble e' is not used"),
    (_step("a", {"X": "data"}, {"Y": "prob"}), "data", "prob prob_2",
     "ensemble output 'prob_2' for ensemble e' is not used"),
    (f'{_step("a", {"X": "data"}, {"Y": "prob"})}, {_step("b", {"X": "w"}, {"Y": "prob_2"})}', "data", "prob prob_2",
     "output 'prob_2' for ensemble 'e' is not written: at least one of its depending tensors, 'w', is not connected"),
    (_step("a", {"X": "data"}, {"Y": "prob", "Z": "extra"}), "data", "prob",
     "ensemble tensor 'extra' is unused in ensemble 'e'"),
    (_step("a", {"X": "data"}, {"Y": "prob"}), "data", "prob", ""),
])
def test_ensemble_graph_in_tritons_words(steps: str, inputs: str, outputs: str, problem: str) -> None:
    assert config_problem(parse_text(_ensemble(steps, inputs, outputs))) == problem


@pytest.mark.parametrize(("metrics", "problem"), [
    ("metric_control [{ histogram_options { buckets: [ 1 ] } }]", "metric control must specify 'metric_identifier'"),
    ('metric_control [{ metric_identifier { family: "" } histogram_options { buckets: [ 1 ] } }]',
     "metric identifier must specify non-empty 'family'"),
    ('metric_control [{ metric_identifier { family: "f" } }]', "metric control must specify 'histogram_options'"),
    ('metric_control [{ metric_identifier { family: "f" } histogram_options { } }]',
     "histogram options must specify non-empty 'buckets'"),
    ('metric_control [{ metric_identifier { family: "f" } histogram_options { buckets: [ 1 ] } }]', ""),
])
def test_model_metrics_in_tritons_words(metrics: str, problem: str) -> None:
    assert config_problem(parse_text(_config(f"model_metrics {{ {metrics} }}"))) == problem


def test_only_the_first_response_histogram_is_customizable() -> None:
    config = parse_text(_config('model_metrics { metric_control [{ metric_identifier { family: "nv_inference_first_'
                                'response_histogram_ms" } }, { metric_identifier { family: "nv_inference_request_'
                                'success" } }] }'))
    assert uncustomizable_families(config.model_metrics) == ["nv_inference_request_success"]


def _model(tmp_path: Path, config: str, files: dict[str, str]) -> str:
    path = tmp_path / "m"
    (path / "1").mkdir(parents=True)
    (path / "config.pbtxt").write_text(config)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return str(path)


def test_a_platform_that_is_not_its_backends_is_refused_at_the_poll(tmp_path: Path) -> None:
    # Triton names the backend by the default model file when it does not know the platform.
    spec = load_spec("m", _model(tmp_path, _config("").replace('backend: "onnxruntime"\n', "").replace(
        "onnxruntime_onnx", "onnxruntim") + 'default_model_filename: "model.onnx"', {"1/model.onnx": "x"}),
        autocomplete=False)
    assert spec.poll_failed and spec.error == "unexpected 'platform' and 'backend' pair, got:onnxruntim, onnxruntime"


@pytest.mark.parametrize(("runtime", "files", "problem"), [
    ("__invalid__", {}, "unable to find backend library '__invalid__' for model 'm', searched: '{m}/1' '{m}' "),
    ("../lib/libtriton_identity.so", {"lib/libtriton_identity.so": ""},
     "backend library name '../lib/libtriton_identity.so' escapes backend directory '{m}/1', for model 'm', check "
     "model config runtime field"),
    ("libtriton_onnxruntime.so", {}, ""),
])
def test_a_runtime_library_is_found_as_triton_finds_it(tmp_path: Path, runtime: str, files: dict[str, str],
                                                       problem: str) -> None:
    path = _model(tmp_path, _config(f'runtime: "{runtime}"'), {"1/model.onnx": "x", **files})
    spec = load_spec("m", path, autocomplete=False)
    assert spec.version_errors.get(1, "") == problem.format(m=path)


def test_strict_model_config_warnings_are_tritons() -> None:
    deprecated = ("Warning: '--strict-model-config' has been deprecated! Please use '--disable-auto-complete-config' "
                  "instead.")
    overridden = ("Warning: Overriding deprecated '--strict-model-config' from False to True in favor of "
                  "'--disable-auto-complete-config'!")
    assert strict_config_warnings(["--strict-model-config=true"], True, False) == [deprecated]
    assert strict_config_warnings(["--strict-model-config=false", "--disable-auto-complete-config"], False,
                                  True) == [deprecated, overridden]
    assert strict_config_warnings(["--disable-auto-complete-config"], False, True) == []


@pytest.mark.parametrize(("name", "backend", "problem"), [
    ("plain", "", "Invalid model name: Could not determine backend for model 'plain' with no backend in model "
                  "configuration. Expected model name of the form 'model.<backend_name>'."),
    ("m.identity", "identity", ""),
    ("m.unknown", "unknown", "Invalid argument: unable to find backend library for backend 'unknown', try "
                             "specifying runtime on the model configuration."),
])
def test_a_config_without_backend_or_model_file_takes_it_from_the_name(tmp_path: Path, name: str, backend: str,
                                                                       problem: str) -> None:
    path = tmp_path / name
    (path / "1").mkdir(parents=True)
    (path / "config.pbtxt").write_text('max_batch_size: 4\ninput [{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }]'
                                       '\noutput [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }]')
    spec = load_spec(name, str(path))
    assert spec.error == problem and spec.config.backend == backend
    assert spec.poll_failed == (backend == "")


def test_a_batch_size_for_an_onnx_model_without_a_batch_dimension_is_refused(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    from conveyor.deploy.example_repo import IR_VERSION, OPSET

    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "g",
                              [helper.make_tensor_value_info("INPUT0", TensorProto.INT32, [16])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.INT32, [16])])
    model = helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", OPSET)])
    path = tmp_path / "bad_max_batch_size"
    (path / "1").mkdir(parents=True)
    onnx.save(model, str(path / "1" / "model.onnx"))
    (path / "config.pbtxt").write_text('max_batch_size: 1\n'
                                       'input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }]')
    spec = load_spec("bad_max_batch_size", str(path))
    assert spec.error == ("model 'bad_max_batch_size': autofill failed for model 'bad_max_batch_size': model does not "
                          "support batching while non-zero max_batch_size is specified")


def test_a_negative_gpu_id_is_refused_on_any_host() -> None:
    config = parse_text(_config("instance_group [{ kind: KIND_GPU gpus: [ 0 ] }, { kind: KIND_GPU gpus: [ -1 ] }]"))
    assert instance_group_problem(config) == (
        "instance group m_1 of model m specifies invalid or unsupported gpu id -1. GPUs with at least the minimum "
        "required CUDA compute compatibility have ids from 0")
