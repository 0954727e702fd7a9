"""Property-based tests of ``config.pbtxt`` reading: any text either parses or raises
``text_format.ParseError``; any parsed config is either valid or gets a reason from
``repository.validate``; and a model directory holding it is listed with that
reason, never a crash of the router's scan."""

from __future__ import annotations

import os
import tempfile

from google.protobuf import text_format
from hypothesis import event, given
from hypothesis import strategies as st

from conveyor.proto.model_config import parse_text, to_json
from conveyor.router.repository.scan import load_spec
from conveyor.router.spec.validate import validate
from tests.support.fuzz import bounded, tried

LEVEL = "unit"

# --- a grammar of config.pbtxt, with values of any kind ------------------------------

numbers = st.sampled_from(["0", "1", "-1", "8", "-5", "2147483648", "99999999999999999999", "1.5", "0x10", "nan"])
strings = st.sampled_from(['"m"', '"x"', '""', '"onnxruntime_onnx"', '"python"', '"\\xff"', "'a'", '"unterminated'])
enums = st.sampled_from(["TYPE_FP32", "TYPE_STRING", "TYPE_INVALID", "KIND_GPU", "KIND_CPU", "REJECT", "DELAY", "NOPE"])
junk = numbers | strings | enums | st.sampled_from(["true", "false", "[]", "[ 1, -1 ]", "[ 0 ]", "[ -2, 3 ]"])


def usually(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """The field's own kind of value nine times in ten, anything otherwise."""
    return st.one_of(*[strategy] * 9, junk)


TENSOR_FIELDS = {
    "name": usually(st.sampled_from(['"x"', '"y"', '""'])),
    "data_type": usually(st.sampled_from(["TYPE_FP32", "TYPE_INT8", "TYPE_STRING", "TYPE_INVALID", "7"])),
    "dims": usually(st.sampled_from(["[ 4 ]", "[ -1 ]", "[ 0 ]", "[ -1, 2 ]", "[ -2 ]", "[ ]", "[ 3, 0 ]"])),
    "optional": usually(st.sampled_from(["true", "false"])),
    "reshape": usually(st.sampled_from(["{ shape: [ 4 ] }", "{ shape: [ ] }"])),
}
TOP_FIELDS = {
    "platform": usually(st.sampled_from(['"onnxruntime_onnx"', '"pytorch_libtorch"', '"tensorrt_plan"', '"x"'])),
    "backend": usually(st.sampled_from(['"python"', '"onnxruntime"', '"nope"'])),
    "max_batch_size": usually(st.sampled_from(["0", "8", "-1", "2147483647"])),
    "default_model_filename": usually(st.sampled_from(['"model.onnx"', '"../x"', '""'])),
}


@st.composite
def tensor(draw: st.DrawFn) -> str:
    keys = draw(st.lists(st.sampled_from(sorted(TENSOR_FIELDS)), max_size=4, unique=True))
    return "{ " + " ".join(f"{k}: {draw(TENSOR_FIELDS[k])}" for k in keys) + " }"


@st.composite
def config_text(draw: st.DrawFn) -> str:
    parts = ['name: "m"'] if draw(st.booleans()) else []
    keys = draw(st.lists(st.sampled_from(sorted(TOP_FIELDS)), max_size=3, unique=True))
    parts += [f"{k}: {draw(TOP_FIELDS[k])}" for k in keys]
    for kind in ("input", "output"):
        if draw(st.integers(0, 3)):
            parts.append(f"{kind} [ " + ", ".join(draw(st.lists(tensor(), max_size=3))) + " ]")
    if draw(st.booleans()):
        parts.append("dynamic_batching { " + draw(st.sampled_from([
            "", "max_queue_delay_microseconds: -1", "preferred_batch_size: [ 0, 100 ]", "priority_levels: 3",
            "priority_levels: 2 default_priority_level: 5", "default_queue_policy { timeout_action: DELAY }",
            "priority_queue_policy { key: 9 value: { max_queue_size: -1 } }", "preserve_ordering: 7",
        ])) + " }")
    if draw(st.booleans()):
        parts.append("instance_group [ { count: " + draw(numbers) + " kind: " + draw(enums) + " } ]")
    if draw(st.booleans()):
        parts.append("model_transaction_policy { decoupled: " + draw(st.sampled_from(["true", "1", "x"])) + " }")
    text = "\n".join(draw(st.permutations(parts)))
    if draw(st.integers(0, 5)) == 0 and text:
        cut = draw(st.integers(0, len(text) - 1))
        text = text[:cut] + draw(st.sampled_from(["{", "}", "[", ":", "\0", "\ufffd", "#"])) + text[cut:]
    return text


def parsed_or_refused(text: str) -> None:
    try:
        config = parse_text(text)
    except text_format.ParseError:
        event("refused by the parser")
        return
    problem = validate(config)
    event("refused by validate" if problem else "valid")
    assert isinstance(problem, str)
    to_json(config)  # what /config would serve


@bounded(400)
@given(config_text())
def test_config_text_parses_or_is_refused(text: str) -> None:
    tried("config.pbtxt grammar")
    parsed_or_refused(text)


@bounded(200)
@given(st.text(max_size=80))
def test_any_text_parses_or_is_refused(text: str) -> None:
    tried("config.pbtxt arbitrary text")
    parsed_or_refused(text)


@bounded(100)
@given(config_text(), st.sampled_from(["model.onnx", "model.py", "model.plan"]))
def test_a_model_directory_with_any_config_is_listed_with_a_reason(text: str, filename: str) -> None:
    tried("model directory scan")
    with tempfile.TemporaryDirectory() as repo:
        os.makedirs(os.path.join(repo, "m", "1"))
        with open(os.path.join(repo, "m", "config.pbtxt"), "w", encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(repo, "m", "1", filename), "wb") as f:
            f.write(b"not a model")
        spec = load_spec("m", os.path.join(repo, "m"), autocomplete=False)
    assert spec.error or spec.versions or spec.version_errors
