"""Triton Python models that call other models (BLS) for the tests: the calls
themselves, calls that wait on their callee (cancellation), and calls the
server must refuse. Written as a user would write them for Triton."""

from __future__ import annotations

from tests.support.python_models import write_model

# BLS: calls other models through the server; the request parameter "mode"
# picks the call. execute is async, as Triton allows, to await async_exec.
BLS_MODEL = '''
import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def call(model, inputs, outputs, **kwargs):
    tensors = [pb_utils.Tensor(name, array) for name, array in inputs.items()]
    return pb_utils.InferenceRequest(model_name=model, inputs=tensors, requested_output_names=outputs, **kwargs)


def output(response, name):
    return pb_utils.get_output_tensor_by_name(response, name).as_numpy()


class TritonPythonModel:
    async def execute(self, requests):
        return [await self._one(request) for request in requests]

    async def _one(self, request):
        a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
        mode = json.loads(request.parameters())["mode"]
        if mode == "onnx":
            response = call("simple", {"INPUT0": a[None], "INPUT1": b[None]}, ["OUTPUT0", "OUTPUT1"]).exec()
            out0, out1 = output(response, "OUTPUT0")[0], output(response, "OUTPUT1")[0]
        elif mode == "python":
            response = call("py_errors", {"INPUT0": a}, []).exec()  # no names: every output
            assert not response.has_error(), response.error().message()
            out0, out1 = output(response, "OUTPUT0"), b
        elif mode == "gather":
            onnx, python = await asyncio.gather(
                call("simple", {"INPUT0": a[None], "INPUT1": b[None]}, ["OUTPUT1"]).async_exec(),
                call("py_errors", {"INPUT0": b}, ["OUTPUT0"]).async_exec(),
            )
            out0, out1 = output(onnx, "OUTPUT1")[0], output(python, "OUTPUT0")
        elif mode == "decoupled":
            values = []
            for response in call("py_repeat", {"IN": a[:3]}, ["OUT"]).exec(decoupled=True):
                if response.has_error():
                    return response
                if response.output_tensors():
                    values.append(int(output(response, "OUT")[0]))
            out0, out1 = np.array(values + [0] * (16 - len(values)), dtype=np.int32), b
        else:  # the callee's error comes back in its response
            model = {"error": "py_errors", "self": "py_bls", "missing": "no_such_model"}[mode]
            inputs = {"INPUT0": -a} if mode == "error" else {"INPUT0": -a, "INPUT1": b}
            response = call(model, inputs, ["OUTPUT0"], timeout=200000).exec()
            assert response.has_error()
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("callee: " + response.error().message()))
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out0.astype(np.int32)),
                                           pb_utils.Tensor("OUTPUT1", out1.astype(np.int32))])
'''

BLS_CONFIG = '''
name: "py_bls"
backend: "python"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
instance_group [{ count: 1, kind: KIND_CPU }]
'''


# Works on a request until its client goes away, at most 20 s: then answers
# CANCELLED (counted as a failure in its statistics). Decoupled or not, by config.
WAIT_MODEL = '''
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                sender = request.get_response_sender()
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))]))
                threading.Thread(target=self._finish, args=(request, sender)).start()
            return None
        return [self._wait(request) for request in requests]

    def _finish(self, request, sender):
        sender.send(self._wait(request), FINAL)

    @staticmethod
    def _wait(request):
        deadline = time.monotonic() + 20
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        if request.is_cancelled():
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("stopped", pb_utils.TritonError.CANCELLED))
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([2], dtype=np.int32))])
'''


def _wait_config(name: str, decoupled: bool) -> str:
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    return f'''
name: "{name}"
backend: "python"
{policy}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
'''


# BLS checks: the request parameter "mode" picks what to try; OUT is a JSON
# report of what the model saw. "invalid": wrong requests fail only their own
# exec()/async_exec() and the model goes on; "params": a callee's response
# parameters; "wait"/"wait_async"/"wait_stream": a call that waits until the
# request is cancelled (its report is kept for "last").
BLS_CHECK_MODEL = '''
import asyncio
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

A = np.arange(20, 36, dtype=np.int32)  # no 13: py_errors raises on it


def call(model, inputs, outputs=(), **kwargs):
    tensors = [pb_utils.Tensor(name, array) for name, array in inputs.items()]
    return pb_utils.InferenceRequest(model_name=model, inputs=tensors, requested_output_names=list(outputs), **kwargs)


def listed(array):
    return [v.decode() for v in array.reshape(-1)] if array.dtype == np.object_ else array.tolist()


def seen(response):
    if response.has_error():
        return {"error": response.error().message(), "code": response.error().code()}
    return {"outputs": {t.name(): listed(t.as_numpy()) for t in response.output_tensors()},
            "parameters": json.loads(response.parameters())}


def invalid_calls():
    return {
        "input_name": call("py_errors", {"WRONG": A}),
        "datatype": call("py_errors", {"INPUT0": A.astype(np.float32)}),
        "shape": call("simple", {"INPUT0": A[None, :8], "INPUT1": A[None, :8]}),  # needs [n, 16]
        "model": call("no_such_model", {"INPUT0": A}),
        "version": call("py_errors", {"INPUT0": A}, model_version=7),
        "output": call("py_errors", {"INPUT0": A}, ["NOPE"]),
    }


class TritonPythonModel:
    def initialize(self, args):
        self.last = {}

    async def execute(self, requests):
        responses = []
        for request in requests:
            report = await self._run(request, json.loads(request.parameters())["mode"])
            out = np.array([json.dumps(report).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses

    async def _run(self, request, mode):
        if mode == "invalid":
            report = {name: seen(r.exec()) for name, r in invalid_calls().items()}
            pending = invalid_calls()
            done = await asyncio.gather(*(r.async_exec() for r in pending.values()))
            report["async"] = {name: seen(r) for name, r in zip(pending, done)}
            report["after"] = seen(call("py_errors", {"INPUT0": A}).exec())  # the model goes on
            report["bytes"] = seen(call("py_bytes", {"INPUT0": np.array([b"ab", b"c"], dtype=np.object_)}).exec())
            return report
        if mode == "params":
            return seen(call("py_params", {"IN": A[:3]}, parameters={"tag": "bls"}).exec())
        if mode == "last":
            return self.last
        if mode == "control":
            try:
                pb_utils.load_model("py_errors")
                loaded = "loaded"
            except pb_utils.TritonModelException as exc:
                loaded = exc.message()
            return {"ready": pb_utils.is_model_ready("py_errors"), "nope": pb_utils.is_model_ready("no_such_model"),
                    "v7": pb_utils.is_model_ready("py_errors", "7"), "load": loaded}
        start = time.monotonic()
        if mode == "wait":
            got = [seen(call("py_wait", {"IN": A[:1]}).exec())]
        elif mode == "wait_async":
            got = [seen(await call("py_wait", {"IN": A[:1]}).async_exec())]
        else:
            got = [seen(r) for r in call("py_wait_stream", {"IN": A[:1]}).exec(decoupled=True)]
        self.last = {"mode": mode, "got": got, "waited_s": time.monotonic() - start,
                     "is_cancelled": request.is_cancelled()}
        return self.last
'''

BLS_CHECK_CONFIG = '''
name: "py_bls_check"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [{ count: 1, kind: KIND_CPU }]
'''


def build(repo: str) -> None:
    write_model(repo, "py_bls", BLS_MODEL, BLS_CONFIG)
    write_model(repo, "py_wait", WAIT_MODEL, _wait_config("py_wait", decoupled=False))
    write_model(repo, "py_wait_stream", WAIT_MODEL, _wait_config("py_wait_stream", decoupled=True))
    write_model(repo, "py_bls_check", BLS_CHECK_MODEL, BLS_CHECK_CONFIG)
