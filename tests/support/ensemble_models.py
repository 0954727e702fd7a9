"""Ensembles over tiny ONNX and Python models, for the ensemble and response-cache tests."""

from __future__ import annotations

from onnx import TensorProto, helper

from conveyor.deploy.example_repo import IR_VERSION, OPSET, add_sub, write_model
from tests.support import python_models
from tests.support.python_models import REPEAT_CONFIG, REPEAT_MODEL

_FAILING_STEP = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("step exploded on purpose"))
                for _ in requests]
'''

_INT32_IO = '''
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }} ]
'''


def identity_int32(repo: str, name: str, max_batch_size: int = 8, op: str = "Identity") -> None:
    """OUTPUT0 = INPUT0 (``op`` "Neg": OUTPUT0 = -INPUT0), INT32 [16]."""
    vi = helper.make_tensor_value_info
    dims: list[str | int] = ["B", 16] if max_batch_size else [16]
    graph = helper.make_graph(
        [helper.make_node(op, ["INPUT0"], ["OUTPUT0"])], name,
        [vi("INPUT0", TensorProto.INT32, dims)], [vi("OUTPUT0", TensorProto.INT32, dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    write_model(repo, name, f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
                + _INT32_IO.format() + ("dynamic_batching { }\n" if max_batch_size else ""),
                {"model.onnx": model.SerializeToString()})


def gate(repo: str, name: str = "gate") -> None:
    """OUTPUT0 = INPUT0 (INT32 [16]) and FLAG = sum(INPUT0) > 0 (BOOL [1]), per row."""
    vi = helper.make_tensor_value_info
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    zero = helper.make_tensor("zero", TensorProto.INT32, [], [0])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"]),
         helper.make_node("ReduceSum", ["INPUT0", "axes"], ["total"], keepdims=1),
         helper.make_node("Greater", ["total", "zero"], ["FLAG"])], name,
        [vi("INPUT0", TensorProto.INT32, ["B", 16])],
        [vi("OUTPUT0", TensorProto.INT32, ["B", 16]), vi("FLAG", TensorProto.BOOL, ["B", 1])], [axes, zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    write_model(repo, name, f'''name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }}, {{ name: "FLAG" data_type: TYPE_BOOL dims: [ 1 ] }} ]
''', {"model.onnx": model.SerializeToString()})


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {ins} {outs} }}'


def _when(conditions: dict[str, str]) -> str:
    """Conveyor's conditional-step parameters: {"conveyor.step.1.when": "flag == true", ...}."""
    return "\n".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in conditions.items())


def ensemble(repo: str, name: str, inputs: list[str], outputs: list[str], steps: list[str],
             max_batch_size: int = 8, extra: str = "") -> None:
    """An INT32 [16] ensemble over ``steps`` (see ``_step``); an output named FLAG* is BOOL [1]."""
    ins = ", ".join(f'{{ name: "{t}" data_type: TYPE_INT32 dims: [ 16 ] }}' for t in inputs)
    outs = ", ".join(f'{{ name: "{t}" data_type: TYPE_BOOL dims: [ 1 ] }}' if t.startswith("FLAG") else
                     f'{{ name: "{t}" data_type: TYPE_INT32 dims: [ 16 ] }}' for t in outputs)
    write_model(repo, name, f'''name: "{name}"
platform: "ensemble"
max_batch_size: {max_batch_size}
input [ {ins} ]
output [ {outs} ]
ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
{extra}
''')


ADD_SUB = {"INPUT0": "A", "INPUT1": "B"}

# OUTPUT0 = the sum of whichever of its optional inputs the request carries.
_OPTIONAL_SUM = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            total = np.zeros(16, np.int32)
            for name in ("INPUT0", "INPUT1"):
                given = pb_utils.get_input_tensor_by_name(request, name)
                if given is not None:
                    total = total + given.as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)]))
        return responses
'''


# OUTPUT0 = INPUT0 + INPUT1; OUTPUT1, which its config declares, left out (Triton's qa partial_add_sub).
_PARTIAL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            + pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy())]) for r in requests]
'''


def optional_inputs(repo: str) -> None:
    """An ensemble whose inputs a request may leave out, over a model whose inputs are optional too
    (Triton's L0_optional_input): a step runs without the input the request did not give."""
    optional = ('input [{ name: "%s" data_type: TYPE_INT32 dims: [ 16 ] optional: true }, '
                '{ name: "%s" data_type: TYPE_INT32 dims: [ 16 ] optional: true }]\n')
    python_models.write_model(repo, "py_optional_sum", _OPTIONAL_SUM, 'backend: "python"\nmax_batch_size: 0\n'
                              + optional % ("INPUT0", "INPUT1")
                              + 'output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }]\n')
    write_model(repo, "ens_optional", 'name: "ens_optional"\nplatform: "ensemble"\nmax_batch_size: 0\n'
                + optional % ("A", "B") + 'output [{ name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] }]\n'
                + f'ensemble_scheduling {{ step [ {_step("py_optional_sum", ADD_SUB, {"OUTPUT0": "OUT"})} ] }}\n')


def build(repo: str) -> None:
    add_sub(repo, "simple", 8, "dynamic_batching { }")
    optional_inputs(repo)
    identity_int32(repo, "ident")
    identity_int32(repo, "negate", op="Neg")
    python_models.write_model(repo, "py_fail", _FAILING_STEP,
                              'backend: "python"\nmax_batch_size: 8\n' + _INT32_IO.format())
    # simple -> ident: SUM = A + B through two models, DIFF straight from the first.
    ensemble(repo, "ens_chain", ["A", "B"], ["SUM", "DIFF"], [
        _step("simple", ADD_SUB, {"OUTPUT0": "sum", "OUTPUT1": "DIFF"}),
        _step("ident", {"INPUT0": "sum"}, {"OUTPUT0": "SUM"}),
    ])
    # A diamond, listed out of order: simple, then ident and negate side by side, then simple again.
    # OUT0 = (A + B) + -(A - B) = 2B, OUT1 = (A + B) - -(A - B) = 2A.
    ensemble(repo, "ens_diamond", ["A", "B"], ["OUT0", "OUT1"], [
        _step("simple", {"INPUT0": "left", "INPUT1": "right"}, {"OUTPUT0": "OUT0", "OUTPUT1": "OUT1"}),
        _step("ident", {"INPUT0": "sum"}, {"OUTPUT0": "left"}),
        _step("negate", {"INPUT0": "diff"}, {"OUTPUT0": "right"}),
        _step("simple", ADD_SUB, {"OUTPUT0": "sum", "OUTPUT1": "diff"}),
    ])
    python_models.write_model(repo, "py_partial", _PARTIAL, 'backend: "python"\nmax_batch_size: 8\n'
                              'input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, '
                              '{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }]\n'
                              'output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, '
                              '{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }]\n')
    ensemble(repo, "ens_partial", ["A", "B"], ["SUM", "DIFF"], [
        _step("py_partial", ADD_SUB, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}),
    ])
    ensemble(repo, "ens_fails", ["A", "B"], ["OUT"], [
        _step("simple", ADD_SUB, {"OUTPUT0": "sum"}),
        _step("py_fail", {"INPUT0": "sum"}, {"OUTPUT0": "OUT"}),
    ])
    # An ensemble input of any length feeding ident's [16]: it loads (the dims agree where both are fixed),
    # and a request of another length is refused at the step, in Triton's words.
    write_model(repo, "ens_loose", '''name: "ens_loose"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [ ''' + _step("ident", {"INPUT0": "A"}, {"OUTPUT0": "OUT"}) + " ] }\n")
    # Conditional steps (a Conveyor extension): if / else on the sign of sum(A) ...
    gate(repo)
    ensemble(repo, "ens_if_else", ["A"], ["POS", "NEG"], [
        _step("gate", {"INPUT0": "A"}, {"OUTPUT0": "a", "FLAG": "positive"}),
        _step("ident", {"INPUT0": "a"}, {"OUTPUT0": "POS"}),
        _step("negate", {"INPUT0": "a"}, {"OUTPUT0": "NEG"}),
    ], extra=_when({"conveyor.step.1.when": "positive == true", "conveyor.step.2.when": "positive == false"}))
    # ... and an early exit: a non-positive sum answers with FLAG alone.
    ensemble(repo, "ens_exit", ["A"], ["FLAG", "OUT"], [
        _step("gate", {"INPUT0": "A"}, {"OUTPUT0": "a", "FLAG": "FLAG"}),
        _step("negate", {"INPUT0": "a"}, {"OUTPUT0": "OUT"}),
    ], extra=_when({"conveyor.exit_when": "FLAG == false"}))
    ensemble(repo, "ens_bad_condition", ["A"], ["OUT"], [_step("ident", {"INPUT0": "A"}, {"OUTPUT0": "OUT"})],
             extra=_when({"conveyor.step.0.when": "A is big"}))
    # Invalid: each is UNAVAILABLE with its reason, the others serve.
    ensemble(repo, "ens_missing_model", ["A"], ["OUT"], [_step("no_such_model", {"INPUT0": "A"}, {"OUTPUT0": "OUT"})])
    ensemble(repo, "ens_cycle", ["A"], ["OUT"], [
        _step("ident", {"INPUT0": "x"}, {"OUTPUT0": "y"}),
        _step("ident", {"INPUT0": "y"}, {"OUTPUT0": "x"}),
        _step("ident", {"INPUT0": "A"}, {"OUTPUT0": "OUT"}),
    ])
    ensemble(repo, "ens_too_big", ["A"], ["OUT"], [_step("ident", {"INPUT0": "A"}, {"OUTPUT0": "OUT"})],
             max_batch_size=16)
    # A batching ensemble over a non-batching model (Triton's rule: it fits any ensemble), whose output
    # feeds a batching model and is an ensemble output too: the batch dimension is taken off and put back.
    identity_int32(repo, "ident_nobatch", max_batch_size=0, op="Neg")
    ensemble(repo, "ens_nobatch_step", ["A"], ["OUT", "NEG"], [
        _step("ident_nobatch", {"INPUT0": "A"}, {"OUTPUT0": "NEG"}),
        _step("ident", {"INPUT0": "NEG"}, {"OUTPUT0": "OUT"}),
    ])
    python_models.write_model(repo, "py_repeat", REPEAT_MODEL, REPEAT_CONFIG)
    # Two decoupled steps whose responses cannot be paired (a streaming ensemble is fine: see
    # tests/router/ensembles/test_ensemble_decoupled_e2e.py).
    write_model(repo, "ens_two_streams", 'name: "ens_two_streams"\nplatform: "ensemble"\nmax_batch_size: 0\n'
                'input [ { name: "A" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
                'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, '
                '{ name: "OUT2" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
                'ensemble_scheduling { step [ ' + _step("py_repeat", {"IN": "A"}, {"OUT": "OUT"}) + ", "
                + _step("py_repeat", {"IN": "A"}, {"OUT": "OUT2"}) + " ] }\n")
    ensemble(repo, "ens_bad_tensor", ["A"], ["OUT"], [_step("ident", {"NOPE": "A"}, {"OUTPUT0": "OUT"})])
