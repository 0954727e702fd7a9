"""``model_warmup``: samples built as Triton builds them, run before the instance
is reported loaded; a failing sample fails the load; warmup is not in the statistics."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.utils import InferenceServerException

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.datatypes import serialize_bytes
from conveyor.proto.errors import ConveyorError, Status
from conveyor.workers.warmup import sample_inputs, warm_up
from tests.support.group import Server

LEVEL = "e2e"


def config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


class Recorder:
    """An array backend that records each execution's inputs; fails when told to."""

    def __init__(self, fail: str = "") -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail = fail

    def execute(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        self.calls.append(inputs)
        if self.fail:
            raise ConveyorError(Status.INVALID_ARG, self.fail)
        return {}

    def close(self) -> None:
        pass


BATCHED = """max_batch_size: 8
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
model_warmup [ { name: "s" batch_size: 3 count: 2
  inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] random_data: true } } } ]"""


def test_a_batched_sample_is_one_execution_of_batch_size_rows_count_times(caplog: pytest.LogCaptureFixture) -> None:
    backend = Recorder()
    with caplog.at_level("DEBUG", logger="conveyor.workers.warmup"):
        warm_up(backend, config('name: "m" ' + BATCHED), "/nonexistent", per_request=False, instance="m_0_0")
    assert len(backend.calls) == 2
    assert all(c["X"].shape == (3, 2) and c["X"].dtype == np.float32 for c in backend.calls)
    # Triton's verbose lines, which L0_warmup looks for in the server's log (--log-verbose=1).
    for iteration in (1, 2):
        assert f"model 'm' instance m_0_0 is running warmup sample 's' for iteration {iteration}" in caplog.text


def test_batch_size_zero_is_skipped_and_count_zero_runs_once() -> None:
    zeros = '{ key: "X" value: { data_type: TYPE_INT32 dims: [ 4 ] zero_data: true } }'
    cfg = config(f"""max_batch_size: 0 model_warmup [ {{ name: "skip" batch_size: 0 inputs {zeros} }},
                                                     {{ name: "once" batch_size: 1 inputs {zeros} }} ]""")
    backend = Recorder()
    warm_up(backend, cfg, "/nonexistent", per_request=False)
    assert len(backend.calls) == 1 and backend.calls[0]["X"].tolist() == [0, 0, 0, 0]  # no batch dimension


def test_file_data_is_read_from_the_warmup_folder(tmp_path: Any) -> None:
    os.makedirs(tmp_path / "warmup")
    (tmp_path / "warmup" / "x.bin").write_bytes(np.arange(4, dtype=np.int16).tobytes() + b"extra")
    (tmp_path / "warmup" / "s.bin").write_bytes(serialize_bytes(np.array([b"ab", b""], dtype=np.object_)))
    sample = config("""max_batch_size: 2 model_warmup [ { name: "f" batch_size: 1
      inputs { key: "X" value: { data_type: TYPE_INT16 dims: [ 4 ] input_data_file: "x.bin" } }
      inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "s.bin" } }
      inputs { key: "Z" value: { data_type: TYPE_STRING dims: [ 1 ] random_data: true } } } ]""")
    inputs = sample_inputs(sample.model_warmup[0], sample, str(tmp_path))
    assert inputs["X"].tolist() == [[0, 1, 2, 3]]
    assert inputs["S"].tolist() == [[b"ab", b""]] and inputs["Z"].tolist() == [[b""]]


@pytest.mark.parametrize("inputs,message", [
    ('{ key: "X" value: { data_type: TYPE_FP32 dims: [ -1 ] zero_data: true } }',
     "warmup setting expects all variable-size dimensions are specified for input 'X'"),
    ('{ key: "X" value: { data_type: TYPE_FP32 dims: [ 2 ] } }',
     "warmup setting expects input 'X' to have input_data_type set"),
    ('{ key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "short.bin" } }',
     "warmup setting expects 16 bytes, but the data provided from short.bin only has 3 bytes"),
])
def test_bad_samples_are_refused_with_triton_wording(tmp_path: Any, inputs: str, message: str) -> None:
    os.makedirs(tmp_path / "warmup")
    (tmp_path / "warmup" / "short.bin").write_bytes(b"abc")
    cfg = config(f'max_batch_size: 1 model_warmup [ {{ name: "bad" batch_size: 1 inputs {inputs} }} ]')
    with pytest.raises(ConveyorError, match=message):
        warm_up(Recorder(), cfg, str(tmp_path), per_request=False)


def test_a_failing_execution_fails_with_the_sample_name() -> None:
    with pytest.raises(ConveyorError) as exc:
        warm_up(Recorder(fail="boom"), config(BATCHED), "/nonexistent", per_request=False)
    assert exc.value.status is Status.INVALID_ARG
    assert exc.value.message == "failed to run warmup sample 's': boom; "


def test_a_warmed_model_is_ready_and_warmup_is_not_in_its_statistics(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("warm_counter")
    inp = httpclient.InferInput("INPUT0", [1, 2], "FP32").set_data_from_numpy(np.ones((1, 2), np.float32))
    seen, executions = client.infer("warm_counter", [inp]).as_numpy("OUTPUT0")[0].tolist()
    assert (seen, executions) == (7, 3)  # 2 executions of 3 warmup requests ran before it
    stats = client.get_inference_statistics("warm_counter")["model_stats"][0]
    assert stats["inference_count"] == 1 and stats["execution_count"] == 1
    assert stats["inference_stats"]["success"]["count"] == 1


def test_a_model_whose_warmup_fails_is_unavailable_with_the_reason(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert not client.is_model_ready("warm_fails")
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["warm_fails"]["state"] == "UNAVAILABLE"
    assert "failed to run warmup sample 'cold start'" in index["warm_fails"]["reason"]
    assert "zeros are too cold" in index["warm_fails"]["reason"]
    inp = httpclient.InferInput("INPUT0", [1, 2], "FP32").set_data_from_numpy(np.ones((1, 2), np.float32))
    with pytest.raises(InferenceServerException, match="failed to run warmup sample 'cold start'"):
        client.infer("warm_fails", [inp])
    assert client.is_server_ready()
