"""A load request's ``config`` parameter read as Triton's JsonToModelConfig reads it (protobuf's C++ JSON
parser): L0_lifecycle's test_concurrent_model_instance_load_sanity sends ``"instance_group": {...}``."""

from __future__ import annotations

import pytest
from google.protobuf import json_format

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.model_config import parse_json_config

LEVEL = "unit"


def test_a_single_value_where_a_list_is_wanted_is_one_element() -> None:
    config = parse_json_config('{"instance_group": {"kind": "kind_cpu", "count": 5}, "input": [{"name": "I", '
                               '"data_type": "type_fp32", "dims": 4}], "version_policy": {"specific": '
                               '{"versions": 2}}}')
    assert [(g.kind, g.count) for g in config.instance_group] == [(mc.ModelInstanceGroup.KIND_CPU, 5)]
    assert list(config.input[0].dims) == [4] and config.input[0].data_type == mc.TYPE_FP32
    assert list(config.version_policy.specific.versions) == [2]


def test_a_bare_key_is_read_as_protobufs_parser_reads_it() -> None:
    config = parse_json_config('{"name": "m", sequence_batching: { "iterative_sequence": true, direct: '
                               '{ "max_queue_delay_microseconds": 7 } }, "parameters": {"k": {"string_value": '
                               '"a: b, c: d"}}}')
    batching = config.sequence_batching
    assert batching.iterative_sequence and batching.direct.max_queue_delay_microseconds == 7
    assert config.parameters["k"].string_value == "a: b, c: d"  # a string's text is left as it is


@pytest.mark.parametrize("text", ['{"no_such_field": 1}', "{max_batch_size 1}", '{"max_batch_size": "many"}', "{"])
def test_what_triton_refuses_is_refused(text: str) -> None:
    with pytest.raises(json_format.ParseError):
        parse_json_config(text)
