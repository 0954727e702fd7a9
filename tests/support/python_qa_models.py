"""Python models for the behaviours Triton's python-backend QA (qa/L0_backend_python) checks,
written here in our own words (CI cannot fetch Triton's qa/): instance names, ``model.py`` as a
package, configs without inputs, responses sent around ``execute``'s return, ``async def
execute`` running concurrently, request rescheduling, BF16 tensors, BLS refused in
``initialize``, a worker lost while loading. ``tests/workers/backends/python/
test_python_triton_qa_e2e.py`` serves them; ``deploy/triton_qa_python.sh`` runs Triton's own."""

from __future__ import annotations

import textwrap

from tests.support.python_models import write_model

# Writes its Triton instance name into the directory its config names, one file per instance.
NAMES_MODEL = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = __import__("json").loads(args["model_config"])
        folder = config["parameters"]["names_dir"]["string_value"]
        with open(os.path.join(folder, args["model_instance_name"]), "w") as f:
            f.write(args["model_name"])

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros([1], np.int32))]) for _ in requests]
'''


def names_config(folder: str) -> str:
    return f'''
name: "qa_names"
backend: "python"
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU }}, {{ name: "special" count: 1 kind: KIND_CPU }} ]
parameters {{ key: "names_dir" value {{ string_value: "{folder}" }} }}
'''


# `from . import` a sibling file (Triton imports <version>.model), and a plain import of another.
PACKAGE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils
import plain_helper

from . import relative_helper


class TritonPythonModel:
    def execute(self, requests):
        value = relative_helper.VALUE + plain_helper.VALUE
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))]) for _ in requests]
'''

# No inputs at all (Triton's BLS-memory and argument-validation QA models have none).
NO_INPUTS_CONFIG = '''
name: "qa_package"
backend: "python"
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
'''

# The default (not decoupled) mode's response sender, around execute's return. MODE:
#   0: returns None; a thread sends the response, then the final flag, after execute returned
#   1: sends two responses during execute (the second raises): the first is the answer
#   2: sends a response with the final flag, then returns another: the sent one is the answer
#   3: sends the final flag before any response: Triton's error
#   4: returns the response (value 0)
SENDER_MODEL = '''
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def respond(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


def later(sender, value):
    time.sleep(0.3)
    sender.send(respond(value))
    sender.send(flags=FINAL)


class TritonPythonModel:
    def execute(self, requests):
        returned = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            sender = request.get_response_sender()
            if mode == 0:
                threading.Thread(target=later, args=(sender, 2000), daemon=True).start()
                returned.append(None)
            elif mode == 1:
                sender.send(respond(1000))
                sender.send(respond(1001))  # raises: execute fails, the sent response stays
            elif mode == 2:
                sender.send(respond(1000), flags=FINAL)
                returned.append(respond(0))  # raises at return: the sent response stays
            elif mode == 3:
                sender.send(flags=FINAL)
            else:
                returned.append(respond(0))
        return returned
'''

# The same sender after return, from an asyncio task an `async def execute` started.
ASYNC_SENDER_MODEL = '''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.tasks = set()

    async def execute(self, requests):
        for request in requests:
            task = asyncio.create_task(self.later(request.get_response_sender()))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return None

    async def later(self, sender):
        await asyncio.sleep(0.3)
        out = pb_utils.Tensor("OUT", np.array([2000], np.int32))
        sender.send(pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''


def sender_config(name: str) -> str:
    return f'''
name: "{name}"
backend: "python"
input [ {{ name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
'''


# A decoupled `async def execute` that sleeps WAIT seconds: several run at once on one instance.
SLEEPER_MODEL = '''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        waits = [float(pb_utils.get_input_tensor_by_name(r, "WAIT").as_numpy()[0]) for r in requests]
        if any(w < 0 for w in waits):
            raise ValueError("wait cannot be negative")
        await asyncio.gather(*(asyncio.sleep(w) for w in waits))
        for request, wait in zip(requests, waits):
            out = pb_utils.Tensor("OUT", np.array([wait], np.float32))
            request.get_response_sender().send(
                pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
        return None
'''

SLEEPER_CONFIG = '''
name: "qa_sleeper"
backend: "python"
input [ { name: "WAIT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
model_transaction_policy { decoupled: true }
'''

# A decoupled `async def execute` calling qa_sleeper through async_exec(decoupled=True): the await
# must not hold the instance's event loop while the callee sleeps.
ASYNC_BLS_MODEL = '''
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.gather(*(self.forward(r) for r in requests))
        return None

    async def forward(self, request):
        wait = pb_utils.get_input_tensor_by_name(request, "WAIT")
        responses = await pb_utils.InferenceRequest(
            model_name="qa_sleeper", inputs=[wait], requested_output_names=["OUT"]).async_exec(decoupled=True)
        sender = request.get_response_sender()
        for response in responses:
            out = pb_utils.get_output_tensor_by_name(response, "OUT")
            if out is not None:
                sender.send(pb_utils.InferenceResponse([out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

# Request rescheduling: each request is released with RESCHEDULE once, answered the second time.
RESCHEDULE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = set()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if request.request_id() not in self.seen:
                self.seen.add(request.request_id())
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
        return responses
'''

# Rescheduled but answered anyway: Triton's error.
RESCHEDULE_WRONG_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        x = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]) for _ in requests]
'''

# iterative_sequence, decoupled: one response per execute, rescheduled until the count is done.
ITERATIVE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            key = request.request_id()
            if key not in self.left:
                self.left[key] = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            self.left[key] -= 1
            out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.left[key]], np.int32))])
            sender = request.get_response_sender()
            if self.left[key] <= 0:
                del self.left[key]
                sender.send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(out)
        return None
'''


def int_config(name: str, extra: str = "") -> str:
    return f'''
name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
{extra}
'''


ITERATIVE_EXTRA = "model_transaction_policy { decoupled: true }\nsequence_batching { iterative_sequence: true }"

# BF16 through DLPack and torch; as_numpy() of a BF16 tensor raises Triton's error.
BF16_MODEL = '''
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            try:
                tensor.as_numpy()
            except pb_utils.TritonModelException as exc:
                assert "Tensor dtype is BF16 and cannot be converted to NumPy" in str(exc), str(exc)
            else:
                raise AssertionError("as_numpy() of a BF16 tensor did not raise")
            doubled = torch.utils.dlpack.from_dlpack(tensor.to_dlpack()) * 2
            assert doubled.dtype == torch.bfloat16
            out = pb_utils.Tensor.from_dlpack("OUT", torch.utils.dlpack.to_dlpack(doubled))
            try:
                out.as_numpy()
            except pb_utils.TritonModelException:
                responses.append(pb_utils.InferenceResponse([out]))
        return responses
'''

BF16_CONFIG = '''
name: "qa_bf16"
backend: "python"
input [ { name: "IN" data_type: TYPE_BF16 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_BF16 dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU } ]
'''

# BLS from initialize: refused, as in Triton, so the model fails to load.
BLS_IN_INITIALIZE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.InferenceRequest(
            model_name="qa_sender", inputs=[pb_utils.Tensor("MODE", np.array([4], np.int32))],
            requested_output_names=["OUT"],
        ).exec()

    def execute(self, requests):
        return None
'''

# Kills its own process while loading (an out-of-memory kill, say): the load fails.
KILLS_ITS_WORKER_MODEL = '''
import os
import signal


class TritonPythonModel:
    def initialize(self, args):
        os.kill(os.getpid(), signal.SIGKILL)

    def execute(self, requests):
        return None
'''


# A decoupled callee: 20 responses of 1, 50 ms apart, unless cancelled (and IGNORE is false).
UNTIL_CANCELLED_MODEL = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        request = requests[0]
        ignore = bool(pb_utils.get_input_tensor_by_name(request, "IGNORE").as_numpy()[0])
        sender = request.get_response_sender()
        for sent in range(20):
            if request.is_cancelled() and not ignore:
                error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                return None
            out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))])
            sender.send(out, flags=FINAL if sent == 19 else 0)
            time.sleep(0.05)
        return None
'''

# Sums the callee's responses through exec(decoupled=True), cancelling the iterator at 5.
BLS_CANCEL_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        ignore = pb_utils.get_input_tensor_by_name(requests[0], "IGNORE")
        responses = pb_utils.InferenceRequest(
            model_name="qa_until_cancelled", inputs=[ignore], requested_output_names=["OUT"],
        ).exec(decoupled=True)
        total, cancelled = 0, False
        for response in responses:
            if response.has_error():
                cancelled = response.error().code() == pb_utils.TritonError.CANCELLED
                break
            out = pb_utils.get_output_tensor_by_name(response, "OUT")
            total += int(out.as_numpy()[0]) if out is not None else 0
            if total == 5:
                responses.cancel()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SUM", np.array([total], np.int32)),
                                            pb_utils.Tensor("CANCELLED", np.array([cancelled], bool))])]
'''

IGNORE_INPUT = 'input [ { name: "IGNORE" data_type: TYPE_BOOL dims: [ 1 ] } ]'
UNTIL_CANCELLED_CONFIG = f'''
name: "qa_until_cancelled"
backend: "python"
{IGNORE_INPUT}
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
model_transaction_policy {{ decoupled: true }}
'''
BLS_CANCEL_CONFIG = f'''
name: "qa_bls_cancel"
backend: "python"
{IGNORE_INPUT}
output [ {{ name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "CANCELLED" data_type: TYPE_BOOL dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
'''


# Decides its own readiness (Triton 2.6x's is_ready()): its config's READY parameter.
READINESS_MODEL = '''
import json


class TritonPythonModel:
    def initialize(self, args):
        self.ready = json.loads(args["model_config"])["parameters"]["READY"]["string_value"] == "true"

    def execute(self, requests):
        return None

    async def is_ready(self):
        return self.ready
'''


def readiness_config(name: str, ready: bool) -> str:
    return f'''
name: "{name}"
backend: "python"
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
parameters {{ key: "READY" value {{ string_value: "{"true" if ready else "false"}" }} }}
'''


def build(repo: str, names_dir: str) -> None:
    """The models that load at start (the test writes the failing ones itself, then loads them)."""
    write_model(repo, "qa_names", NAMES_MODEL, names_config(names_dir))
    write_model(repo, "qa_package", PACKAGE_MODEL, NO_INPUTS_CONFIG,
                {"relative_helper.py": "VALUE = 40\n", "plain_helper.py": "VALUE = 2\n"})
    write_model(repo, "qa_sender", SENDER_MODEL, sender_config("qa_sender"))
    write_model(repo, "qa_async_sender", ASYNC_SENDER_MODEL, sender_config("qa_async_sender"))
    write_model(repo, "qa_sleeper", SLEEPER_MODEL, SLEEPER_CONFIG)
    write_model(repo, "qa_async_bls", ASYNC_BLS_MODEL, SLEEPER_CONFIG.replace("qa_sleeper", "qa_async_bls"))
    write_model(repo, "qa_reschedule", RESCHEDULE_MODEL, int_config("qa_reschedule"))
    write_model(repo, "qa_reschedule_wrong", RESCHEDULE_WRONG_MODEL, int_config("qa_reschedule_wrong"))
    write_model(repo, "qa_iterative", ITERATIVE_MODEL, int_config("qa_iterative", ITERATIVE_EXTRA))
    write_model(repo, "qa_bf16", BF16_MODEL, BF16_CONFIG)
    write_model(repo, "qa_until_cancelled", UNTIL_CANCELLED_MODEL, UNTIL_CANCELLED_CONFIG)
    write_model(repo, "qa_bls_cancel", BLS_CANCEL_MODEL, BLS_CANCEL_CONFIG)
    write_model(repo, "qa_says_ready", READINESS_MODEL, readiness_config("qa_says_ready", True))
    write_model(repo, "qa_says_not_ready", READINESS_MODEL, readiness_config("qa_says_not_ready", False))


def write_failing(repo: str, name: str, model_py: str) -> None:
    write_model(repo, name, model_py, textwrap.dedent(f'''
        name: "{name}"
        backend: "python"
        output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        instance_group [ {{ kind: KIND_CPU }} ]
    '''))
