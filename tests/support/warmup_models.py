"""Models with ``model_warmup`` for the warmup tests (written into the shared test repository)."""

from __future__ import annotations

from tests.support.python_models import write_model

# Counts the requests it has executed and answers each with the count so far:
# the first client request reads how many warmup requests ran before it.
COUNTER_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = 0
        self.batches = []

    def execute(self, requests):
        self.batches.append(len(requests))
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            assert x.shape == (1, 2) and x.dtype == np.float32
            self.seen += 1
            out = np.array([[self.seen, len(self.batches)]], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]))
        return responses
'''

COUNTER_CONFIG = '''
name: "warm_counter"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
model_warmup [
  { name: "zeros" batch_size: 3 count: 2
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } },
  { name: "skipped" batch_size: 0
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } }
]
'''

# Refuses zeros, so its warmup sample fails and the model never becomes ready.
COLD_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            if not pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().any():
                raise ValueError("zeros are too cold")
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "INPUT0")]) for r in requests]
'''

COLD_CONFIG = '''
name: "warm_fails"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
model_warmup [
  { name: "cold start" batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } }
]
'''


def build(repo: str) -> None:
    write_model(repo, "warm_counter", COUNTER_MODEL, COUNTER_CONFIG)
    write_model(repo, "warm_fails", COLD_MODEL, COLD_CONFIG)
