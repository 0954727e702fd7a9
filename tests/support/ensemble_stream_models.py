"""Ensembles with a decoupled step: a Python model that streams ``1 .. N`` and ONNX
steps that transform each of its responses (tests/router/ensembles/test_ensemble_decoupled_e2e.py)."""

from __future__ import annotations

from onnx import TensorProto, helper

from conveyor.deploy.example_repo import IR_VERSION, OPSET, write_model
from tests.support import python_models
from tests.support.ensemble_models import _step

# Streams OUT = 1, 2, ..., N (INT32 [1] per row; batched requests, each on its own thread):
#   N > 0: those N responses at once, then the final flag;      N = 0: only the final flag;
#   N < 0: |N| responses, a pause, then a final error response;
#   N >= 1000: one response every 20 ms until the request is cancelled (counted), then the final flag;
#   N = 999: one response carrying how many requests were cancelled so far.
COUNT_MODEL = '''
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        self.cancelled = 0

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            threading.Thread(target=self._stream, args=(request, n)).start()
        return None

    @staticmethod
    def _send(sender, value, flags=0):
        out = pb_utils.Tensor("OUT", np.array([[value]], dtype=np.int32))
        sender.send(pb_utils.InferenceResponse([out]), flags)

    def _stream(self, request, n):
        sender = request.get_response_sender()
        if n == 999:
            self._send(sender, self.cancelled, FINAL)
        elif n >= 1000:
            i, deadline = 0, time.monotonic() + 30
            while not request.is_cancelled() and time.monotonic() < deadline:
                i += 1
                self._send(sender, i)
                time.sleep(0.02)
            self.cancelled += request.is_cancelled()
            sender.send(flags=FINAL)
        elif n < 0:
            for i in range(1, -n + 1):
                self._send(sender, i)
            time.sleep(0.3)
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"stream broke after {-n}")), FINAL)
        else:
            for i in range(1, n + 1):
                self._send(sender, i)
            sender.send(flags=FINAL)
'''

COUNT_CONFIG = '''
name: "py_count"
backend: "python"
max_batch_size: 8
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
'''

_FAIL_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("the tail step failed on purpose"))
                for _ in requests]
'''


def binary_int32(repo: str, name: str, op: str, constant: int | None = None, delay_us: int = 0) -> None:
    """Y = op(X, Z) (``constant``: Y = op(X, constant)) on INT32 [1] rows, dynamically batched
    (``delay_us``: how long a batch waits to grow)."""
    vi = helper.make_tensor_value_info
    inputs = [vi("X", TensorProto.INT32, ["B", 1])]
    init = []
    if constant is None:
        inputs.append(vi("Z", TensorProto.INT32, ["B", 1]))
        other = "Z"
    else:
        init.append(helper.make_tensor("K", TensorProto.INT32, [], [constant]))
        other = "K"
    graph = helper.make_graph([helper.make_node(op, ["X", other], ["Y"])], name, inputs,
                              [vi("Y", TensorProto.INT32, ["B", 1])], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    names = [i.name for i in inputs]
    ins = ", ".join(f'{{ name: "{n}" data_type: TYPE_INT32 dims: [ 1 ] }}' for n in names)
    write_model(repo, name, f'''name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {ins} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
''', {"model.onnx": model.SerializeToString()})


def _ensemble(repo: str, name: str, outputs: list[str], steps: list[str], extra: str = "") -> None:
    outs = ", ".join(f'{{ name: "{t}" data_type: TYPE_INT32 dims: [ 1 ] }}' for t in outputs)
    write_model(repo, name, f'''name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }}, {outs} ]
ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
{extra}
''')


def build(repo: str) -> None:
    python_models.write_model(repo, "py_count", COUNT_MODEL, COUNT_CONFIG)
    python_models.write_model(repo, "py_tail_fails", _FAIL_MODEL, '''
name: "py_tail_fails"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
''')
    # A batch waits up to 100 ms to grow: the responses of one stream are batched together.
    binary_int32(repo, "times_ten", "Mul", constant=10, delay_us=100_000)
    binary_int32(repo, "plus", "Add")
    binary_int32(repo, "mod_two", "Mod", constant=2)
    count = _step("py_count", {"N": "N"}, {"OUT": "COUNT"})
    # Each response i: COUNT = i, TENS = 10 i, PLUS = i + N (a response's tensor with the request's).
    _ensemble(repo, "ens_stream", ["TENS", "PLUS"], [
        count,
        _step("times_ten", {"X": "COUNT"}, {"Y": "TENS"}),
        _step("plus", {"X": "COUNT", "Z": "N"}, {"Y": "PLUS"}),
    ])
    _ensemble(repo, "ens_tail_fails", ["Y"], [count, _step("py_tail_fails", {"X": "COUNT"}, {"Y": "Y"})])
    # A condition on each response (Conveyor's extension): only odd counts go through times_ten.
    _ensemble(repo, "ens_stream_odd", ["TENS"], [
        count,
        _step("mod_two", {"X": "COUNT"}, {"Y": "odd"}),
        _step("times_ten", {"X": "COUNT"}, {"Y": "TENS"}),
    ], extra='parameters { key: "conveyor.step.2.when" value { string_value: "odd == 1" } }')
    # An ensemble whose step is a streaming ensemble: decoupled too, each inner response flows on.
    _ensemble(repo, "ens_outer", ["TENS", "MORE"], [
        _step("ens_stream", {"N": "N"}, {"COUNT": "COUNT", "TENS": "tens"}),
        _step("times_ten", {"X": "tens"}, {"Y": "TENS"}),
        _step("plus", {"X": "tens", "Z": "N"}, {"Y": "MORE"}),
    ])
