"""Python models for the rate-limiter tests: each execution sleeps a little and
answers with the monotonic times it started and ended, so a test can check
which executions overlapped without measuring anything itself."""

from __future__ import annotations

from tests.support.python_models import write_model

INTERVAL_MODEL = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        start = time.monotonic()
        time.sleep(0.02)
        end = time.monotonic()
        out = np.array([start, end], dtype=np.float64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]) for _ in requests]
'''


def _config(name: str, resources: str, count: int = 1) -> str:
    return f'''
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP64 dims: [ 2 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU rate_limiter {{ resources [ {resources} ] }} }} ]
'''


def build(repo: str) -> None:
    """``rl_a`` (2 instances) and ``rl_b`` share one copy of R; ``rl_big`` needs
    more of "big" than the server is given, and so does one of ``rl_half``'s two instances."""
    write_model(repo, "rl_a", INTERVAL_MODEL, _config("rl_a", '{ name: "R" count: 1 }', count=2))
    write_model(repo, "rl_b", INTERVAL_MODEL, _config("rl_b", '{ name: "R" count: 1 }'))
    write_model(repo, "rl_big", INTERVAL_MODEL, _config("rl_big", '{ name: "big" count: 3 global: true }'))
    # One instance group that fits, one that does not: the model does not load (Triton's rule).
    write_model(repo, "rl_half", INTERVAL_MODEL, _config("rl_half", '{ name: "big" count: 1 global: true }') +
                'instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ '
                '{ name: "big" count: 3 global: true } ] } } ]\n')
