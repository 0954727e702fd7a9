"""Triton Python models (``model.py`` + ``config.pbtxt``) for the tests, written
into the test repository as a user would write them for Triton."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

from conveyor.deploy import example_repo

# Written the way Triton's python_backend examples/add_sub is: the proof that
# such a model.py runs unchanged.
ADD_SUB_MODEL = '''
import json

# Every Triton Python model can import this module; it holds the request,
# response and tensor types and helpers for reading the model config.
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """The class name every Triton Python model must use."""

    def initialize(self, args):
        """Called once when the model loads. `args` maps strings to strings:
        model_config (JSON), model_instance_kind, model_instance_device_id,
        model_repository, model_version, model_name."""
        self.model_config = model_config = json.loads(args["model_config"])

        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")

        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        """Gets a list of pb_utils.InferenceRequest and returns one
        pb_utils.InferenceResponse per request, in the same order."""
        output0_dtype = self.output0_dtype
        output1_dtype = self.output1_dtype

        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")

            out_0, out_1 = (
                in_0.as_numpy() + in_1.as_numpy(),
                in_0.as_numpy() - in_1.as_numpy(),
            )

            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(output1_dtype))

            # An error for this request alone would be:
            # pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("An error occurred"))
            inference_response = pb_utils.InferenceResponse(output_tensors=[out_tensor_0, out_tensor_1])
            responses.append(inference_response)

        return responses

    def finalize(self):
        """Called once when the model unloads."""
        print("Cleaning up...")
'''

ADD_SUB_CONFIG = '''
name: "add_sub"
backend: "python"

input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
input [
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "OUTPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]

instance_group [{ kind: KIND_CPU }]
'''

# Batched identity that also reports what each request looked like to the model.
IDENTITY_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        pb_utils.Logger.log_info(f"initialized {args['model_instance_name']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            seen = {
                "request_id": request.request_id(),
                "correlation_id": request.correlation_id(),
                "parameters": json.loads(request.parameters()),
                "requested": sorted(request.requested_output_names()),
                "shape": list(x.shape),
                "batch_requests": len(requests),
                "args": {k: v for k, v in self.args.items() if k != "model_config"},
            }
            info = np.array([json.dumps(seen).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.copy()),
                                                         pb_utils.Tensor("INFO", info)]))
        return responses
'''

IDENTITY_CONFIG = '''
name: "py_identity"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 1000 }
'''

# OUTPUT0 = 2 * INPUT0; a negative input fails that request; 13 makes execute raise.
ERRORS_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x == 13).any():
                raise ValueError("thirteen is unlucky")
            if (x < 0).any():
                error = pb_utils.TritonError("negative input is not allowed", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return responses
'''

ERRORS_CONFIG = '''
name: "py_errors"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
'''

# BYTES in, BYTES out: each element upper-cased, as an object array of bytes.
BYTES_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            assert text.dtype == np.object_ and all(isinstance(v, bytes) for v in text.reshape(-1))
            upper = np.array([v.upper() for v in text.reshape(-1)], dtype=np.object_).reshape(text.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", upper)]))
        return responses
'''

BYTES_CONFIG = '''
name: "py_bytes"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
'''

# No inputs or outputs in the config: the model says what they are.
AUTOCOMPLETE_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_INT64", "dims": [3]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_INT64", "dims": [3]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0")
                                                        .as_numpy() + 1)])
            for r in requests
        ]
'''

IMPORT_FAILS_MODEL = '''
import triton_python_backend_utils as pb_utils
import conveyor_no_such_module  # noqa: F401


class TritonPythonModel:
    def execute(self, requests):
        return []
'''

INIT_FAILS_MODEL = '''
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("weights are missing")

    def execute(self, requests):
        return []
'''


# Decoupled, in the style of Triton's repeat example: one response per element
# of IN (OUT = the value, IDX = its index), the first sent from execute and the
# rest from a thread after execute returned, then the bare final flag.
# 0 sends nothing, -1 an error response (the stream goes on), -2 ends the
# request with an error. Each response carries the response parameter "position".
REPEAT_MODEL = '''
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        assert pb_utils.using_decoupled_model_transaction_policy(__import__("json").loads(args["model_config"]))

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().tolist()
            sender = request.get_response_sender()
            if self._respond(sender, values[:1], 0):
                threading.Thread(target=self._rest, args=(sender, values)).start()
        return None

    def _rest(self, sender, values):
        if self._respond(sender, values[1:], 1):
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    @staticmethod
    def _respond(sender, values, start):
        for i, v in enumerate(values, start):
            if v == -1:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"value -1 at {i} is not allowed")))
            elif v == -2:
                error = pb_utils.TritonError("told to stop", pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error), pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return False
            elif v != 0:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([v], dtype=np.int32)),
                                                        pb_utils.Tensor("IDX", np.array([i], dtype=np.int32))],
                                                       parameters={"position": i}))
        return True
'''

REPEAT_CONFIG = '''
name: "py_repeat"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] }
]
'''

# Decoupled and never done on its own: IN = [1] sends one response, then waits
# until the client goes away (request.is_cancelled()) and counts it; IN = [0]
# answers with that count. One instance, so both kinds of request meet there.
UNTIL_CANCELLED_MODEL = '''
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
            sender = request.get_response_sender()
            if pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0] == 0:
                sender.send(pb_utils.InferenceResponse([self._out(self.cancelled)]), flags=FINAL)
                continue
            sender.send(pb_utils.InferenceResponse([self._out(-1)]))
            threading.Thread(target=self._wait, args=(request, sender)).start()

    def _wait(self, request, sender):
        deadline = time.monotonic() + 60
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.cancelled += sender.is_cancelled()
        sender.send(flags=FINAL)

    @staticmethod
    def _out(value):
        return pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))
'''

UNTIL_CANCELLED_CONFIG = '''
name: "py_until_cancelled"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [{ count: 1, kind: KIND_CPU }]
'''


# Response parameters: OUT = IN, and the response says something about it in
# its parameters (plus the request's "tag" parameter, echoed).
PARAMS_MODEL = '''
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            parameters = {"note": "from py_params", "count": int(x.size), "odd": bool(x[0] % 2)}
            tag = json.loads(request.parameters()).get("tag")
            if tag is not None:
                parameters["tag"] = tag
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x.copy())], parameters=parameters))
        return responses
'''

PARAMS_CONFIG = '''
name: "py_params"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
'''


# Custom metrics, as in Triton's custom_metrics example: a counter of requests,
# a gauge of the last value and a histogram of values, labelled by the model.
METRICS_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.families = [  # kept: a metric does not keep its family, as in Triton
            pb_utils.MetricFamily(
                name="conveyor_test_requests_total", description="Requests seen by the model", kind=pb_utils.COUNTER,
            ),
            pb_utils.MetricFamily("conveyor_test_last_value", "The last value seen", pb_utils.MetricFamily.GAUGE),
            pb_utils.MetricFamily("conveyor_test_value", "Values seen", pb_utils.HISTOGRAM),
        ]
        self.requests = self.families[0].Metric(labels=labels)
        self.last = self.families[1].Metric(labels=labels)
        self.values = self.families[2].Metric(labels=labels, buckets=[1, 10, 100])

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            self.requests.increment(1)
            self.last.set(value)
            self.values.observe(value)
            count = np.array([self.requests.value()], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", count)]))
        return responses
'''

METRICS_CONFIG = '''
name: "py_metrics"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''


def _simple_config(name: str) -> str:
    return f'''
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
'''


def write_model(repo: str, name: str, model_py: str, config: str, files: Mapping[str, str] | None = None) -> str:
    """A Python model: ``1/model.py`` and ``config.pbtxt`` dedented as a user writes them, and
    ``files`` (such as helper modules) beside model.py. Returns the model's directory."""
    return example_repo.write_model(repo, name, textwrap.dedent(config).lstrip(),
                                    {"model.py": textwrap.dedent(model_py).lstrip(), **(files or {})})


def build(repo: str) -> None:
    write_model(repo, "add_sub", ADD_SUB_MODEL, ADD_SUB_CONFIG)
    write_model(repo, "py_identity", IDENTITY_MODEL, IDENTITY_CONFIG)
    write_model(repo, "py_errors", ERRORS_MODEL, ERRORS_CONFIG)
    write_model(repo, "py_bytes", BYTES_MODEL, BYTES_CONFIG)
    write_model(repo, "py_autocomplete", AUTOCOMPLETE_MODEL, 'name: "py_autocomplete"\nbackend: "python"\n')
    write_model(repo, "py_import_fails", IMPORT_FAILS_MODEL, _simple_config("py_import_fails"))
    write_model(repo, "py_init_fails", INIT_FAILS_MODEL, _simple_config("py_init_fails"))
    write_model(repo, "py_repeat", REPEAT_MODEL, REPEAT_CONFIG)
    write_model(repo, "py_until_cancelled", UNTIL_CANCELLED_MODEL, UNTIL_CANCELLED_CONFIG)
    write_model(repo, "py_params", PARAMS_MODEL, PARAMS_CONFIG)
    write_model(repo, "py_metrics", METRICS_MODEL, METRICS_CONFIG)
