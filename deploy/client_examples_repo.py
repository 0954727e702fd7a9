"""The model repository tritonclient's example clients expect, made on the fly (nothing downloaded).

Triton's own QA runs the Python examples of the client repository (``src/python/examples``)
against ``docs/examples/model_repository``. This builds the same models from onnx.helper
graphs and a few lines of Python, under the same names and signatures:

- ``simple``, ``simple_int8``, ``simple_string``: INPUT0 + INPUT1 and INPUT0 - INPUT1, [16],
  batched (``simple_string`` adds the numbers its strings spell, as Triton's does);
- ``simple_identity``: a Python model returning its BYTES input;
- ``simple_sequence`` and ``simple_dyna_sequence``: the sequence models, as Triton's ONNX graphs
  compute them ((INPUT + START) * READY, and with END * CORRID added for the dyna one);
- ``simple_string_dyna_sequence``: a Python model doing what Triton's dyna_sequence test backend
  does, with a string correlation ID (as Triton's qa/L0_grpc makes it);
- ``repeat_int32``: a decoupled Python model with the ``repeat`` backend's signature (one
  response per element of IN, each after its DELAY milliseconds);
- ``custom_identity_int32``: an INT32 identity (``memory_growth_test.py``);
- ``densenet_onnx`` and ``inception_onnx``: stand-ins with the classifiers' signatures (their
  weights are a download; an example that checks a classification cannot pass with them).

    python -m conveyor.deploy.client_examples_repo DIR [NAME...]
"""

from __future__ import annotations

import os
import sys

from onnx import TensorProto, helper

from conveyor.deploy.example_repo import OPSET, _graph, add_sub, save_onnx, write_model

_SEQUENCE_CONTROLS = """  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},{end}
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}{corrid}
  ]"""


def _arith(repo: str, name: str, elem: int, config_type: str) -> None:
    """OUTPUT0/1 = INPUT0 +/- INPUT1 computed in INT32 (the inputs cast from ``elem`` and back)."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Cast", ["INPUT0"], ["A"], to=TensorProto.INT32),
             helper.make_node("Cast", ["INPUT1"], ["B"], to=TensorProto.INT32),
             helper.make_node("Add", ["A", "B"], ["SUM"]), helper.make_node("Sub", ["A", "B"], ["DIFF"]),
             helper.make_node("Cast", ["SUM"], ["OUTPUT0"], to=elem),
             helper.make_node("Cast", ["DIFF"], ["OUTPUT1"], to=elem)]
    model = _graph(nodes, [vi("INPUT0", elem, ["B", 16]), vi("INPUT1", elem, ["B", 16])],
                   [vi("OUTPUT0", elem, ["B", 16]), vi("OUTPUT1", elem, ["B", 16])], name)
    tensors = ",\n".join(f'  {{ name: "{n}" data_type: {config_type} dims: [ 16 ] }}' for n in ("INPUT0", "INPUT1"))
    outs = ",\n".join(f'  {{ name: "{n}" data_type: {config_type} dims: [ 16 ] }}' for n in ("OUTPUT0", "OUTPUT1"))
    save_onnx(model, repo, name, f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                             f"input [\n{tensors}\n]\noutput [\n{outs}\n]\n")


def _sequence(repo: str, name: str, dyna: bool) -> None:
    vi = helper.make_tensor_value_info
    i32 = TensorProto.INT32
    inputs = [vi("INPUT", i32, ["B", 1]), vi("START", i32, ["B", 1])]
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["ADD"])]
    if dyna:
        inputs += [vi("END", i32, ["B", 1]), vi("CORRID", TensorProto.UINT64, ["B", 1])]
        nodes += [helper.make_node("Cast", ["CORRID"], ["CORRID32"], to=i32),
                  helper.make_node("Mul", ["END", "CORRID32"], ["TAIL"]),
                  helper.make_node("Add", ["ADD", "TAIL"], ["SUM"])]
    inputs.append(vi("READY", i32, ["B", 1]))
    nodes.append(helper.make_node("Mul", ["READY", "SUM" if dyna else "ADD"], ["OUTPUT"]))
    model = _graph(nodes, inputs, [vi("OUTPUT", i32, ["B", 1])], name)
    controls = _SEQUENCE_CONTROLS.format(
        end='\n    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },'
        if dyna else "",
        corrid=',\n    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }'
        if dyna else "")
    strategy = ("  max_sequence_idle_microseconds: 10000000\n"
                "  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }\n" if dyna else "")
    instances = 2 if dyna else 1
    save_onnx(model, repo, name, f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                             f"sequence_batching {{\n{strategy}{controls}\n}}\n"
                             'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
                             'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
                             f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n")


def _python(repo: str, name: str, config: str, source: str) -> None:
    write_model(repo, name, f'name: "{name}"\nbackend: "python"\n{config}', {"model.py": source})


_IDENTITY_PY = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''

_REPEAT_PY = '''import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """The repeat backend: one response per element of IN, each after its DELAY (ms)."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY")
            delays = delay.as_numpy() if delay is not None else np.zeros(len(values), np.uint32)
            for i, value in enumerate(values):
                time.sleep(float(delays[i]) / 1000)
                out = pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
                idx = pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32))
                sender.send(pb_utils.InferenceResponse([out, idx]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


_DYNA_PY = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Triton's dyna_sequence test backend: an accumulator per correlation ID (a string that spells
    an integer), set on START, added to otherwise, with the ID added on END."""

    def initialize(self, args):
        self.acc = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            get = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            values = get("INPUT").reshape(-1)
            start, end, ready = (int(get(n).reshape(-1)[0]) for n in ("START", "END", "READY"))
            corrid = get("CORRID").reshape(-1)[0]
            try:
                key = int(corrid.decode() if isinstance(corrid, bytes) else corrid)
            except ValueError:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "dyna sequence backend expects correlation ID to be decodable into an integer")))
                continue
            if ready:
                total = int(values.astype(np.int64).sum())
                self.acc[key] = total if start else self.acc.get(key, 0) + total
                if end:
                    self.acc[key] += key
            value = self.acc.get(key, 0)
            if end:
                self.acc.pop(key, None)
            out = np.array([[value]], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
'''


def _string_dyna(repo: str, name: str) -> None:
    controls = _SEQUENCE_CONTROLS.format(
        end='\n    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },',
        corrid=',\n    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }')
    _python(repo, name, "max_batch_size: 8\nsequence_batching {\n  max_sequence_idle_microseconds: 10000000\n"
            f"{controls}\n}}\n"
            'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n', _DYNA_PY)


def _standin(repo: str, name: str, iname: str, dims: list[int], oname: str, odims: list[int],
             input_format: str) -> None:
    """A classifier's signature (no batching, FP32): the output is the input's first elements."""
    n = 1
    for d in odims:
        n *= d
    vi = helper.make_tensor_value_info
    ints = lambda nm, v: helper.make_tensor(nm, TensorProto.INT64, [len(v)], v)  # noqa: E731
    graph = helper.make_graph(
        [helper.make_node("Flatten", [iname], ["flat"], axis=0),
         helper.make_node("Slice", ["flat", "starts", "ends", "axes"], ["first"]),
         helper.make_node("Reshape", ["first", "shape"], [oname])],
        name, [vi(iname, TensorProto.FLOAT, dims)], [vi(oname, TensorProto.FLOAT, odims)],
        [ints("starts", [0]), ints("ends", [n]), ints("axes", [1]), ints("shape", odims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    fmt = f" format: {input_format}" if input_format else ""
    save_onnx(model, repo, name, f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
                             f'input [ {{ name: "{iname}" data_type: TYPE_FP32{fmt} dims: {dims} }} ]\n'
                             f'output [ {{ name: "{oname}" data_type: TYPE_FP32 dims: {odims} }} ]\n')


def _identity_int32(repo: str, name: str) -> None:
    vi = helper.make_tensor_value_info
    model = _graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                   [vi("INPUT0", TensorProto.INT32, ["B", "N"])], [vi("OUTPUT0", TensorProto.INT32, ["B", "N"])],
                   name)
    save_onnx(model, repo, name, f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 1024\n'
                             'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
                             'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]\n')


BUILDERS = {
    "simple": lambda repo: add_sub(repo, "simple", 8),
    "simple_int8": lambda repo: _arith(repo, "simple_int8", TensorProto.INT8, "TYPE_INT8"),
    "simple_string": lambda repo: _arith(repo, "simple_string", TensorProto.STRING, "TYPE_STRING"),
    "simple_identity": lambda repo: _python(
        repo, "simple_identity", "max_batch_size: 8\n"
        'input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]\n', _IDENTITY_PY),
    "simple_sequence": lambda repo: _sequence(repo, "simple_sequence", dyna=False),
    "simple_dyna_sequence": lambda repo: _sequence(repo, "simple_dyna_sequence", dyna=True),
    "simple_string_dyna_sequence": lambda repo: _string_dyna(repo, "simple_string_dyna_sequence"),
    "densenet_onnx": lambda repo: _standin(repo, "densenet_onnx", "data_0", [3, 224, 224], "fc6_1", [1000],
                                           "FORMAT_NCHW"),
    "inception_onnx": lambda repo: _standin(repo, "inception_onnx", "input:0", [299, 299, 3],
                                            "InceptionV3/Predictions/Softmax:0", [1001], "FORMAT_NHWC"),
    "repeat_int32": lambda repo: _python(
        repo, "repeat_int32", "max_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n"
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },\n'
        '        { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },\n'
        '        { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },\n'
        '         { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]\n', _REPEAT_PY),
    "custom_identity_int32": lambda repo: _identity_int32(repo, "custom_identity_int32"),
}

# Triton's docs/examples/model_repository, in the order its listing gives.
DOCS_MODELS = ["densenet_onnx", "inception_onnx", "simple", "simple_dyna_sequence", "simple_identity",
               "simple_int8", "simple_sequence", "simple_string"]


def build(repo: str, names: list[str] | None = None) -> str:
    """Build ``names`` (default: every model above) into ``repo``."""
    os.makedirs(repo, exist_ok=True)
    for name in names or list(BUILDERS):
        BUILDERS[name](repo)
    return repo


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    unknown = [n for n in argv[1:] if n not in BUILDERS]
    if unknown:
        print(f"unknown models: {' '.join(unknown)}; known: {' '.join(BUILDERS)}", file=sys.stderr)
        return 2
    build(argv[0], argv[1:] or None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
