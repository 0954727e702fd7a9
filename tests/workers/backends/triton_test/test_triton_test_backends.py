"""Triton's test backends in-process: the config checks in the C++ backends' words, the parameters
read as they read them, and the pieces the streaming ones share (``Timeline``, ``Replies``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError
from conveyor.proto.model_config import parse_text
from conveyor.workers.backends.base import RequestItem
from conveyor.workers.backends.triton_test import load_test_backend
from conveyor.workers.backends.triton_test.replies import Replies
from conveyor.workers.backends.triton_test.settings import instance_ordinal, stoi
from conveyor.workers.backends.triton_test.timeline import Schedule, Timeline

LEVEL = "unit"

WAIT_S = 10.0

IDENTITY = """name: "m" backend: "identity" max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]"""
REPEAT = """name: "r" backend: "repeat" max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
        { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]"""


def load_error(backend: str, text: str, device: str = "cpu") -> str:
    with pytest.raises(ConveyorError) as caught:
        load_test_backend(backend, "/repo/m/1/", parse_text(text), device, "m_0_0")
    return caught.value.message


@pytest.mark.parametrize(("change", "message"), [
    (("OUTPUT0\" data_type: TYPE_FP32", "OUTPUT0\" data_type: TYPE_INT32"),
     "expected input and output datatype to match, got TYPE_FP32 and TYPE_INT32"),
    (("OUTPUT0\" data_type: TYPE_FP32 dims: [ 2 ]", "OUTPUT0\" data_type: TYPE_FP32 dims: [ -1, 2 ]"),
     "expected input and output shape to match, got [2] and [-1,2]"),
    (("OUTPUT0", "OUTPUT1"), "expected input and output indices to match"),
    (("OUTPUT0", "OUT0"), "expected output name to follow OUTPUT<index> pattern, got 'OUT0'"),
    (("output [", "output [ { name: \"OUTPUT1\" data_type: TYPE_FP32 dims: [ 2 ] },"),
     "model configuration must have equal input/output pairs"),
])
def test_identity_refuses_a_config_in_its_words(change: tuple[str, str], message: str) -> None:
    assert load_error("identity", IDENTITY.replace(*change)) == message


def test_the_other_backends_refuse_a_config_in_their_words() -> None:
    assert load_error("repeat", REPEAT.replace("max_batch_size: 0", "max_batch_size: 4")) == \
        "repeat backend only supports models with max_batch_size == 0"
    wait_int32 = REPEAT.replace('"WAIT" data_type: TYPE_UINT32', '"WAIT" data_type: TYPE_INT32')
    assert load_error("repeat", wait_int32) == "expected WAIT datatype to be UINT32, got TYPE_INT32"
    square = 'name: "s" backend: "square" input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ] ' \
             'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]'
    assert load_error("square", square) == "expected IN shape to be [1], got [2]"
    sequence = 'name: "q" backend: "sequence" max_batch_size: 4 ' \
               'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ] ' \
               'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]'
    assert load_error("sequence", sequence) == "'START' and 'READY' must be configured as the control inputs"
    assert load_error("iterative_sequence", sequence, device="cuda:0") == \
        "'iterative_sequence' backend only supports CPU instances"


def test_numeric_parameters_read_as_stoi_reads_them() -> None:
    assert stoi("12", "k") == 12 and stoi(" 7ms", "k") == 7 and stoi("-4", "k") == -4
    for bad in ("", "ms", "99999999999"):
        with pytest.raises(ConveyorError, match="parameter 'k' must be an integer"):
            stoi(bad, "k")
    delay = ' parameters [ { key: "creation_delay_sec" value: { string_value: "x" } } ]'
    assert load_error("identity", IDENTITY + delay) == "parameter 'creation_delay_sec' must be an integer, got 'x'"


def test_an_instance_is_numbered_in_its_models_order() -> None:
    config = parse_text('name: "m" instance_group [ { count: 2 kind: KIND_CPU }, { name: "g" count: 2 } ]')
    assert [instance_ordinal(config, n) for n in ("m_0_0", "m_0_1", "g_0", "g_1")] == [0, 1, 2, 3]
    assert instance_ordinal(parse_text('name: "m"'), "m_3") == 3  # one per worker, no instance_group


class Channel:
    """A response channel that keeps what it is sent."""

    def __init__(self) -> None:
        self.cancelled = False
        self.sent: list[tuple[Any, bool]] = []
        self.done = threading.Event()

    @property
    def closed(self) -> bool:
        return self.done.is_set()

    def send(self, outcome: Any, final: bool, output_ns: int = 0) -> None:
        self.sent.append((outcome, final))
        if final:
            self.done.set()

    def fail(self, error: ConveyorError) -> None:
        if not self.closed:
            self.send(error, True)

    def add_cancel_hook(self, hook: Callable[[], None]) -> None: ...

    def remove_cancel_hook(self, hook: Callable[[], None]) -> None: ...

    def reply_from(self, replies: object) -> None: ...


def item_with(channel: Channel, **inputs: np.ndarray) -> RequestItem:
    return RequestItem("", dict(inputs), ["OUT", "IDX"], {}, channel)


def test_a_model_not_decoupled_answers_once_as_tritons_frontends_do() -> None:
    one, two, none = Channel(), Channel(), Channel()
    for channel, count in ((one, 1), (two, 2), (none, 0)):
        replies = Replies(item_with(channel), decoupled=False)
        for i in range(count):
            replies.send({"OUT": np.array([i])})
        assert channel.sent == []  # nothing leaves before the final flag
        replies.finish()
    assert len(one.sent) == 1 and one.sent[0][1] and one.sent[0][0]["OUT"].tolist() == [0]
    assert [(str(o), f) for o, f in two.sent] == [("expected a single response, got 2", True)]
    assert [(str(o), f) for o, f in none.sent] == [("expected a single response, got 0", True)]


def test_the_timeline_steps_every_schedule_when_due_on_one_thread() -> None:
    steps: list[tuple[str, int, str]] = []
    ended: list[str] = []
    both = threading.Event()

    def schedule(name: str, waits: list[float]) -> Schedule:
        for i, wait in enumerate(waits):
            steps.append((name, i, threading.current_thread().name))
            yield wait
        ended.append(name)
        if len(ended) == 2:
            both.set()

    timeline = Timeline("t")
    try:
        timeline.start(schedule("slow", [0.3, 0]), lambda e: None)
        timeline.start(schedule("quick", [0, 0]), lambda e: None)
        assert both.wait(WAIT_S)
    finally:
        timeline.close()
    assert [(n, i) for n, i, _ in steps] == [("slow", 0), ("quick", 0), ("quick", 1), ("slow", 1)]
    assert {t for _, _, t in steps} == {"t-responses"}


def test_repeat_ends_a_request_it_cannot_read_with_its_error() -> None:
    config = parse_text(REPEAT + " model_transaction_policy { decoupled: true }")
    backend = load_test_backend("repeat", "/repo/r/1/", config, "cpu", "r_0")
    channel = Channel()
    try:
        item = item_with(channel, IN=np.array([1, 2], np.int32), DELAY=np.array([0], np.uint32),
                         WAIT=np.array([0], np.uint32))
        assert backend.execute_requests([item]) == []
    finally:
        backend.close()
    assert [(str(o), f) for o, f in channel.sent] == [("expected IN and DELAY shape to match, got [2] and [1]", True)]


def test_dyna_sequence_reads_a_string_correlation_id_as_stoi_does() -> None:
    config = parse_text("""name: "d" backend: "dyna_sequence" max_batch_size: 4
sequence_batching { control_input [
  { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
  { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
  { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
  { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ] }
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]""")
    backend = load_test_backend("dyna_sequence", "/repo/d/1/", config, "cpu", "d_0")

    def request(corrid: bytes, value: int) -> RequestItem:
        flags = {n: np.array([[1]], np.int32) for n in ("START", "END", "READY")}
        inputs = {"INPUT": np.array([[value]], np.int32), "CORRID": np.array([[corrid]], np.object_), **flags}
        return RequestItem("", inputs, ["OUTPUT"], {}, sequence=m.SequenceStep(0, True, True, corrid.decode()))

    first, second = backend.execute_requests([request(b"7 apples", 1), request(b"apples", 1)])
    assert isinstance(first, dict) and first["OUTPUT"].tolist() == [[8]]  # 1 + the id 7
    assert str(second) == "dyna sequence backend expects correlation ID to be decodable into an integer"


def test_implicit_state_needs_its_three_control_inputs() -> None:
    text = """name: "i" backend: "implicit_state" max_batch_size: 0
sequence_batching { control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START
                                                               fp32_false_true: [ 0, 1 ] } ] } ] }
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "TEST_CASE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]"""
    message = "'START', 'END, and 'READY' must be configured as the control inputs"
    assert load_error("implicit_state", text) == message
    without = text.replace(text[text.index("sequence_batching"):text.index("\ninput [")], "")
    assert load_error("implicit_state", without) == message
