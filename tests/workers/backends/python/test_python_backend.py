"""The Python backend in-process: model.py loading, per-request execution,
errors, finalize, and the triton_python_backend_utils surface."""

from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.model_config import parse_text
from conveyor.workers.backends.base import RequestBackend, RequestItem
from conveyor.workers.backends.python import pb_utils
from conveyor.workers.backends.python.backend import PythonBackend
from tests.support import python_models
from tests.support.python_specs import CONFIG, RECORDING_MODEL, write

LEVEL = "unit"


def item(x: np.ndarray, rid: str = "") -> RequestItem:
    return RequestItem(rid, {"INPUT0": x}, ["ROWS", "CALLS"], {})


def test_each_request_keeps_its_own_inputs_and_outcome(tmp_path: Path) -> None:
    path, config = write(tmp_path, "rec", RECORDING_MODEL)
    backend = PythonBackend(path, config, "cpu")
    assert isinstance(backend, RequestBackend)
    a = np.arange(2, dtype=np.int32).reshape(1, 2)
    b = np.arange(4, dtype=np.int32).reshape(2, 2)
    c = np.zeros((3, 2), dtype=np.int32)
    out = backend.execute_requests([item(a), item(b), item(c)])
    assert isinstance(out[0], dict) and isinstance(out[1], dict)
    np.testing.assert_array_equal(out[0]["ROWS"], a + 300)  # three requests in one call, not concatenated
    np.testing.assert_array_equal(out[1]["ROWS"], b + 300)
    assert isinstance(out[2], ConveyorError)
    assert out[2].status is Status.UNSUPPORTED and out[2].message == "three rows"
    backend.close()
    assert (tmp_path / "rec" / "finalized").exists()


def test_instances_do_not_share_module_state(tmp_path: Path) -> None:
    path, config = write(tmp_path, "rec", RECORDING_MODEL)
    first, second = PythonBackend(path, config, "cpu", 0), PythonBackend(path, config, "cpu", 1)
    x = np.zeros((1, 2), dtype=np.int32)
    first.execute_requests([item(x)])
    out = first.execute_requests([item(x)])[0]
    other = second.execute_requests([item(x)])[0]
    assert isinstance(out, dict) and isinstance(other, dict)
    assert out["CALLS"][0, 0] == 2 and other["CALLS"][0, 0] == 1
    first.close()
    second.close()


@pytest.mark.parametrize("body,match", [
    ("import conveyor_missing_dependency\n", "ModuleNotFoundError"),
    ("def nothing_here(): pass\n", "does not define class TritonPythonModel"),
    ("class TritonPythonModel:\n    def initialize(self, args):\n        raise KeyError('w')\n"
     "    def execute(self, r):\n        return r\n", "failed to initialize python model 'broken': KeyError"),
    ("class TritonPythonModel:\n    pass\n", "does not define execute"),
])
def test_load_failures_are_unavailable_with_the_reason(tmp_path: Path, body: str, match: str) -> None:
    path, config = write(tmp_path, "broken", body)
    with pytest.raises(ConveyorError, match=match) as info:
        PythonBackend(path, config, "cpu")
    assert info.value.status is Status.UNAVAILABLE


@pytest.mark.parametrize("returned,match", [  # Triton's stub's words
    ("[]", "InferenceRequest\\(s\\) size is:1, and InferenceResponse\\(s\\) size is:0"),
    ("['x']", "Expected an 'InferenceResponse' object in the execute function return list, found type"),
    ("42", "Expected a list in the execute return, found type '<class 'int'>'"),
])
def test_wrong_execute_results_fail_the_batch(tmp_path: Path, returned: str, match: str) -> None:
    body = f"class TritonPythonModel:\n    def execute(self, requests):\n        return {returned}\n"
    path, config = write(tmp_path, "wrong", body)
    backend = PythonBackend(path, config, "cpu")
    with pytest.raises(ConveyorError, match=match):
        backend.execute_requests([item(np.zeros((1, 2), np.int32))])


def test_response_sender_in_default_mode(tmp_path: Path) -> None:
    body = textwrap.dedent('''
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for r in requests:
                    x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                    r.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("ROWS", x)]),
                                                 flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
    ''')
    path, config = write(tmp_path, "sender", body)
    x = np.ones((1, 2), np.int32)
    out = PythonBackend(path, config, "cpu").execute_requests([item(x)])[0]
    assert isinstance(out, dict)
    np.testing.assert_array_equal(out["ROWS"], x)


# --- triton_python_backend_utils -------------------------------------------------------


def test_utils_are_importable_under_triton_name() -> None:
    from conveyor.workers.backends.python.model_import import register_utils

    register_utils()
    import triton_python_backend_utils

    assert triton_python_backend_utils.Tensor is pb_utils.Tensor


def test_tensor_and_dlpack() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = pb_utils.Tensor("X", x)
    assert t.name() == "X" and t.is_cpu() and t.as_numpy() is x
    back = pb_utils.Tensor.from_dlpack("Y", t.to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), x)
    np.testing.assert_array_equal(pb_utils.Tensor.from_dlpack("Z", x).as_numpy(), x)
    words = pb_utils.Tensor("W", np.array(["a", "é"]))
    assert list(words.as_numpy()) == [b"a", "é".encode()]
    assert pb_utils.Tensor("S", [1, 2]).as_numpy().tolist() == [1, 2]  # what numpy takes as an array, as Triton
    with pytest.raises(TypeError):
        pb_utils.Tensor("S", None)
    with pytest.raises(pb_utils.TritonModelException, match="empty string"):
        pb_utils.Tensor.from_dlpack("", x)
    assert pb_utils.Tensor.from_dlpack("H", x).__dlpack_device__() == (1, 0)


def test_errors_requests_and_responses() -> None:
    err = pb_utils.TritonError("nope")
    assert err.code() == pb_utils.TritonError.INTERNAL and err.message() == "nope"
    codes = [getattr(pb_utils.TritonError, n) for n in
             ("UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS",
              "CANCELLED")]
    assert codes == [int(Status[n]) for n in Status.__members__ if n not in ("DEADLINE_EXCEEDED", "CLIENT_MISTAKE")]
    out = pb_utils.Tensor("OUT", np.zeros(1))
    resp = pb_utils.InferenceResponse(output_tensors=[out])
    assert not resp.has_error() and pb_utils.get_output_tensor_by_name(resp, "OUT") is out
    assert pb_utils.get_output_tensor_by_name(resp, "missing") is None
    req = pb_utils.InferenceRequest.received("m", 1, [out], ["OUT"], "id-1",
                                             {"sequence_id": 7, "sequence_start": True, "k": "v"})
    assert req.correlation_id() == 7 and req.parameters() == '{"k":"v"}'  # compact, as Triton's
    assert req.flags() == pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    assert pb_utils.get_input_tensor_by_name(req, "OUT") is out and not req.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match="needs a Conveyor worker"):
        req.exec()  # outside a worker there is no router to send it to


def test_config_helpers() -> None:
    config = {"name": "m", "input": [{"name": "A", "data_type": "TYPE_FP16", "dims": [2]}],
              "output": [{"name": "B", "data_type": "TYPE_STRING", "dims": [1]}]}
    assert pb_utils.get_input_config_by_name(config, "A") == config["input"][0]
    assert pb_utils.get_output_config_by_name(config, "A") is None
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") is np.float16
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    mc_ = pb_utils.ModelConfig(config)
    mc_.add_input({"name": "A", "data_type": "TYPE_FP16", "dims": [2]})  # agrees: fine
    with pytest.raises(ValueError, match="expects dims"):
        mc_.add_input({"name": "A", "data_type": "TYPE_FP16", "dims": [3]})
    with pytest.raises(ValueError, match="missing 'dims'"):
        mc_.add_output({"name": "C", "data_type": "TYPE_FP32"})
    mc_.set_max_batch_size(8)
    with pytest.raises(ValueError):
        mc_.set_max_batch_size(2)
    encoded = pb_utils.serialize_byte_tensor(np.array([b"ab", b""], dtype=np.object_))
    assert list(pb_utils.deserialize_bytes_tensor(encoded.tobytes())) == [b"ab", b""]


def test_parse_text_of_the_triton_example_config() -> None:
    config = parse_text(python_models.ADD_SUB_CONFIG)
    assert config.backend == "python" and [i.name for i in config.input] == ["INPUT0", "INPUT1"]


def test_an_output_no_datatype_fits_fails_only_its_request() -> None:
    from conveyor.proto import messages as m
    from conveyor.workers.batch_io import IoPlan, plan_request_outputs

    items = [m.BatchItem(i, [], [m.OutputSpec("OUT")]) for i in range(2)]
    outcomes: list[dict[str, np.ndarray] | ConveyorError] = [
        {"OUT": np.zeros(2, np.complex64)}, {"OUT": np.arange(2, dtype=np.int16)}
    ]
    planned = plan_request_outputs(items, outcomes, IoPlan.from_config(mc.ModelConfig(), {}))
    assert isinstance(planned[0], ConveyorError) and "output 'OUT'" in planned[0].message
    assert not isinstance(planned[1], ConveyorError)
    spec, datatype, shape, _ = planned[1][0]
    assert (spec.name, datatype, shape) == ("OUT", "INT16", [2])


# --- what Triton's python-backend QA checks, in-process ---------------------------------


class FakeChannel:
    """A request's channel (workers/item_stream.py) that records what the model sends."""

    def __init__(self) -> None:
        self.cancelled = False
        self.sent: list[tuple[object, bool]] = []
        self.arrived = threading.Event()

    @property
    def closed(self) -> bool:
        return any(final for _, final in self.sent)

    def add_cancel_hook(self, hook: object) -> None: ...

    def remove_cancel_hook(self, hook: object) -> None: ...

    def reply_from(self, replies: object) -> None: ...

    def send(self, outcome: object, final: bool, output_ns: int = 0) -> None:
        self.sent.append((outcome, final))
        self.arrived.set()

    def fail(self, error: ConveyorError) -> None:
        self.send(error, True)


def with_channel(x: np.ndarray) -> tuple[RequestItem, FakeChannel]:
    channel = FakeChannel()
    return RequestItem("", {"INPUT0": x}, ["ROWS"], {}, channel), channel


LATE_MODEL = textwrap.dedent('''
    import threading, time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            def later(request):
                time.sleep(0.1)
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                sender = request.get_response_sender()
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("ROWS", x)]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            for r in requests:
                threading.Thread(target=later, args=(r,)).start()
            return None
''')


def test_a_response_sent_after_execute_returned_answers_later(tmp_path: Path) -> None:
    from conveyor.workers.backends.base import AnsweredLater

    path, config = write(tmp_path, "late", LATE_MODEL)
    backend = PythonBackend(path, config, "cpu")
    x = np.ones((1, 2), np.int32)
    request, channel = with_channel(x)
    out = backend.execute_requests([request])
    assert isinstance(out[0], AnsweredLater)
    assert channel.arrived.wait(10)
    (outcome, final), = channel.sent
    assert final and isinstance(outcome, dict)
    np.testing.assert_array_equal(outcome["ROWS"], x)
    backend.close()


@pytest.mark.parametrize(("body", "expected"), [
    # a second response raises: the request keeps the first, sent one
    ("s.send(respond(1)); s.send(respond(2))", 1),
    # a response returned after one was sent with the final flag raises: the sent one stays
    ("s.send(respond(1), flags=FINAL); return [respond(2)]", 1),
])
def test_a_sent_response_is_kept_when_execute_then_fails(tmp_path: Path, body: str, expected: int) -> None:
    model = textwrap.dedent(f'''
        import numpy as np
        import triton_python_backend_utils as pb_utils
        FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

        def respond(v):
            return pb_utils.InferenceResponse([pb_utils.Tensor("ROWS", np.full((1, 2), v, np.int32))])

        class TritonPythonModel:
            def execute(self, requests):
                s = requests[0].get_response_sender()
                {body}
    ''')
    path, config = write(tmp_path, "sent", model)
    backend = PythonBackend(path, config, "cpu")
    request, _ = with_channel(np.zeros((1, 2), np.int32))
    out = backend.execute_requests([request])[0]
    assert isinstance(out, dict) and out["ROWS"].tolist() == [[expected, expected]]


def test_a_final_flag_before_any_response_fails_with_tritons_words(tmp_path: Path) -> None:
    body = textwrap.dedent('''
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                requests[0].get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    ''')
    path, config = write(tmp_path, "early", body)
    backend = PythonBackend(path, config, "cpu", 3, "early_0_0")
    with pytest.raises(ConveyorError, match="Non-decoupled model cannot send complete final before sending a response"):
        backend.execute_requests([with_channel(np.zeros((1, 2), np.int32))[0]])


def test_model_py_imports_its_siblings_relatively(tmp_path: Path) -> None:
    body = textwrap.dedent('''
        import triton_python_backend_utils as pb_utils
        from . import sibling

        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor("ROWS", sibling.rows())]) for _ in requests]
    ''')
    path, config = write(tmp_path, "pkg", body)
    sibling = "import numpy as np\n\ndef rows():\n    return np.ones((1, 2), np.int32)\n"
    (tmp_path / "pkg" / "1" / "sibling.py").write_text(sibling)
    backend = PythonBackend(path, config, "cpu")
    out = backend.execute_requests([item(np.zeros((1, 2), np.int32))])[0]
    assert isinstance(out, dict) and out["ROWS"].tolist() == [[1, 1]]
    backend.close()
    assert not [m for m in sys.modules if m.startswith("_conveyor_model_pkg")]  # the package went with it


def test_the_instance_name_comes_from_the_router(tmp_path: Path) -> None:
    body = textwrap.dedent('''
        class TritonPythonModel:
            def initialize(self, args):
                assert args["model_instance_name"] == "mygroup_1", args["model_instance_name"]

            def execute(self, requests):
                return None
    ''')
    path, config = write(tmp_path, "named", body)
    PythonBackend(path, config, "cpu", 17, "mygroup_1").close()


def test_rescheduled_requests_are_executed_again(tmp_path: Path) -> None:
    body = textwrap.dedent('''
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                self.calls = 0

            def execute(self, requests):
                self.calls += 1
                out = []
                for r in requests:
                    if self.calls == 1:
                        r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                        out.append(None)
                    else:
                        x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                        out.append(pb_utils.InferenceResponse([pb_utils.Tensor("ROWS", x + self.calls)]))
                return out
    ''')
    path, config = write(tmp_path, "again", body)
    out = PythonBackend(path, config, "cpu").execute_requests([item(np.zeros((1, 2), np.int32))])[0]
    assert isinstance(out, dict) and out["ROWS"].tolist() == [[2, 2]]  # answered by the second execute


def test_bls_from_initialize_is_refused(tmp_path: Path) -> None:
    body = textwrap.dedent('''
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                pb_utils.InferenceRequest(model_name="x", inputs=[], requested_output_names=[]).exec()

            def execute(self, requests):
                return None
    ''')
    path, config = write(tmp_path, "blsinit", body)
    with pytest.raises(ConveyorError, match=r"BLS is only supported during the 'execute' function\."):
        PythonBackend(path, config, "cpu")


def test_a_decoupled_async_execute_runs_in_the_background(tmp_path: Path) -> None:
    body = textwrap.dedent('''
        import asyncio
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            async def execute(self, requests):
                await asyncio.sleep(0.2)
                for r in requests:
                    x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                    r.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("ROWS", x)]),
                                                 flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    ''')
    config_text = CONFIG + "model_transaction_policy {{ decoupled: true }}\n"
    path, config = write(tmp_path, "bg", body, config_text)
    backend = PythonBackend(path, config, "cpu")
    first, first_channel = with_channel(np.ones((1, 2), np.int32))
    second, second_channel = with_channel(np.zeros((1, 2), np.int32))
    assert backend.execute_requests([first]) == [] and backend.execute_requests([second]) == []
    assert not first_channel.sent  # returned before the coroutine answered
    assert first_channel.arrived.wait(10) and second_channel.arrived.wait(10)
    backend.close()


@pytest.mark.parametrize(("returns", "ready"), [("True", True), ("False", False), ("'yes'", False),
                                                ("1 / 0", False)])
def test_a_models_is_ready_decides_its_readiness(tmp_path: Path, returns: str, ready: bool) -> None:
    body = textwrap.dedent(f'''
        import time

        class TritonPythonModel:
            def execute(self, requests):
                return None

            def is_ready(self):
                time.sleep(0.2)
                return {returns}
    ''')
    path, config = write(tmp_path, "own", body)
    backend = PythonBackend(path, config, "cpu")
    assert backend.has_readiness
    first, second = backend.readiness(), backend.readiness()
    assert first is second  # a check still running is joined
    assert first.result(10) is ready
    assert backend.readiness() is not first  # a finished one is not
    backend.close()
    plain_model = "class TritonPythonModel:\n    def execute(self, r):\n        return None\n"
    plain, plain_config = write(tmp_path, "plain", plain_model)
    assert not PythonBackend(plain, plain_config, "cpu").has_readiness


def test_an_instance_name_with_shell_characters_is_refused(tmp_path: Path) -> None:
    """Triton's python backend refuses them (its stub is named after the instance); so does Conveyor."""
    path, config = write(tmp_path, "fine", "class TritonPythonModel:\n    def execute(self, r):\n        return None\n")
    with pytest.raises(ConveyorError, match="Invalid stub name: contains invalid characters"):
        PythonBackend(path, config, "cpu", 0, "model;test_0")
    PythonBackend(path, config, "cpu", 0, "model-with-hyphens_0").close()


def test_an_instance_unloads_while_another_thread_imports(tmp_path: Path) -> None:
    """Instances load and unload on their own threads while others import (a TorchScript model's torch, a
    model's own packages): dropping an unloaded model's modules must not fail on ``sys.modules`` changing
    under it. It did ("RuntimeError: dictionary changed size during iteration" as a model's load error)."""
    path, config = write(tmp_path, "brief", "class TritonPythonModel:\n    def execute(self, r):\n        return None")
    stop = threading.Event()
    placeholder = type(sys)("_conveyor_test_churn")

    def churn() -> None:  # what an import does to sys.modules, as fast as it goes
        names = [f"_conveyor_test_churn_{i}" for i in range(64)]
        while not stop.is_set():
            for name in names:
                sys.modules[name] = placeholder
            for name in names:
                sys.modules.pop(name, None)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # a thread switch at nearly every chance: the race, every time
    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            PythonBackend(path, config, "cpu").close()
    finally:
        stop.set()
        thread.join(10)
        sys.setswitchinterval(interval)


def test_auto_complete_config_refusals_are_in_tritons_words() -> None:
    # triton_python_backend_utils.py's messages, which Triton's L0_model_config greps.
    config = pb_utils.ModelConfig({"name": "m"})
    with pytest.raises(ValueError) as err:
        config.add_input({"data_type": "TYPE_FP32", "dims": [1]})
    assert str(err.value) == "input in auto-complete-config function for model 'm' is missing 'name' property."
    with pytest.raises(ValueError) as err:
        config.add_input({"name": "I", "data_type": "TYPE_FP32", "dims": [1], "shape": [1]})
    assert str(err.value) == ("input 'I' in auto-complete-config function for model 'm' contains property other than "
                              "'name', 'data_type', 'dims' and 'optional'.")
    with pytest.raises(ValueError) as err:
        config.add_output({"name": "O", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
    assert str(err.value) == ("output 'O' in auto-complete-config function for model 'm' contains property other "
                              "than 'name', 'data_type' and 'dims'.")
