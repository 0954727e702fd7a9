"""Python models written into a repository and read back as the router reads them,
for the in-process tests of the Python backend."""

from __future__ import annotations

from pathlib import Path

from conveyor.proto import model_config_pb2 as mc
from conveyor.router.repository.scan import load_spec
from tests.support import python_models

# Records what execute saw, writes a marker file in finalize, and keeps a counter
# in module state (to show instances do not share it).
RECORDING_MODEL = '''
import os
import triton_python_backend_utils as pb_utils

calls = 0


class TritonPythonModel:
    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], "finalized")

    def execute(self, requests):
        global calls
        calls += 1
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x.shape[0] == 3:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("three rows", pb_utils.TritonError.UNSUPPORTED)))
                continue
            rows = pb_utils.Tensor("ROWS", x + len(requests) * 100)
            responses.append(pb_utils.InferenceResponse([rows, pb_utils.Tensor("CALLS", x[:1] * 0 + calls)]))
        return responses

    def finalize(self):
        open(self.marker, "w").close()
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] }} ]
output [ {{ name: "ROWS" data_type: TYPE_INT32 dims: [ 2 ] }}, {{ name: "CALLS" data_type: TYPE_INT32 dims: [ 2 ] }} ]
'''


def write(repo: Path, name: str, model_py: str, config: str = CONFIG) -> tuple[str, mc.ModelConfig]:
    python_models.write_model(str(repo), name, model_py, config.format(name=name))
    spec = load_spec(name, str(repo / name))
    assert not spec.error, spec.error
    return spec.versions[1], spec.config
