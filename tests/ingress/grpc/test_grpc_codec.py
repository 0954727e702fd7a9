"""Golden cases for the gRPC codec, without sockets.

Requests are built by tritonclient.grpc itself (``_get_inference_request``, what
``InferenceServerClient.infer`` sends) or by hand for the typed ``contents`` form
tritonclient never uses; responses are read back with tritonclient's own
``InferResult``: tritonclient is the judge.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.grpc import _utils as tg_utils
from tritonclient.grpc import service_pb2 as tpb

from conveyor.ingress.dataplane import InferResult, OutputTensor
from conveyor.ingress.grpc import codec
from conveyor.ingress.grpc.wire import parse_infer_request
from conveyor.proto import grpc_service_pb2 as pb
from conveyor.proto.datatypes import numpy_dtype, serialize_bytes
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.shm_params import ShmPlacement

LEVEL = "unit"


def client_request(
    inputs: list[tg.InferInput], outputs: list[tg.InferRequestedOutput] | None = None, **kw: Any
) -> bytes:
    """The bytes tritonclient.grpc puts on the wire for ``infer(...)``."""
    args: dict[str, Any] = dict(
        model_version="",
        request_id="",
        outputs=outputs,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )
    args.update(kw)
    request = tg_utils._get_inference_request(model_name="m", inputs=inputs, **args)
    return bytes(request.SerializeToString())


def call_of(buf: bytes) -> Any:
    req = parse_infer_request(buf)
    return codec.to_infer_call(req.message, req.raw)


def rejected(request: Any, match: str, status: Status = Status.INVALID_ARG) -> None:
    with pytest.raises(ConveyorError, match=match) as err:
        codec.to_infer_call(request)
    assert err.value.status == status


def typed_request(datatype: str, field: str, values: list[Any], shape: list[int] | None = None) -> Any:
    req = pb.ModelInferRequest(model_name="m")
    tensor = req.inputs.add(name="x", datatype=datatype, shape=shape or [len(values)])
    getattr(tensor.contents, field).extend(values)
    return req


# --- requests: raw contents -----------------------------------------------------------


def test_tritonclient_raw_inputs_are_views_of_the_received_bytes() -> None:
    a = np.arange(2 * 8192, dtype=np.float32).reshape(2, 8192)  # large enough to be split, not copied
    b = np.array([[1, -2]], dtype=np.int64)
    s = np.array([b"hi", "é".encode(), b""], dtype=object)
    inputs = [
        tg.InferInput("A", [2, 8192], "FP32").set_data_from_numpy(a),
        tg.InferInput("B", [1, 2], "INT64").set_data_from_numpy(b),
        tg.InferInput("S", [3], "BYTES").set_data_from_numpy(s),
    ]
    buf = client_request(inputs, request_id="r7", model_version="2")
    call = call_of(buf)
    assert (call.model, call.version, call.id, call.outputs, call.parameters) == ("m", "2", "r7", None, {})
    assert [(i.name, i.datatype, i.shape) for i in call.inputs] == [
        ("A", "FP32", [2, 8192]),
        ("B", "INT64", [1, 2]),
        ("S", "BYTES", [3]),
    ]
    for inp, expected in zip(call.inputs, [a.tobytes(), b.tobytes(), serialize_bytes(s)], strict=True):
        assert isinstance(inp.data, memoryview)
        assert inp.data.obj is buf  # no copy: a view of what grpc received
        assert inp.data == expected


def test_small_tritonclient_request() -> None:
    x = tg.InferInput("x", [1, 2], "INT32").set_data_from_numpy(np.array([[1, 2]], np.int32))
    (inp,) = call_of(client_request([x])).inputs
    assert (inp.name, inp.datatype, inp.shape) == ("x", "INT32", [1, 2])
    assert inp.data == np.array([1, 2], np.int32).tobytes()


def test_raw_inputs_from_a_plain_message() -> None:
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP16", shape=[2])
    req.raw_input_contents.append(np.array([1.5, -2], np.float16).tobytes())
    (inp,) = codec.to_infer_call(req, timeout_s=1.5).inputs
    assert np.frombuffer(inp.data, np.float16).tolist() == [1.5, -2.0]  # type: ignore[arg-type]


def test_raw_and_typed_contents_do_not_mix() -> None:
    req = typed_request("INT32", "int_contents", [1, 2])
    req.inputs.add(name="y", datatype="INT32", shape=[1])
    req.raw_input_contents.extend([b"\0" * 4, b"\0" * 4])
    rejected(req, "contents field must not be specified when using raw_input_contents for 'x' for model 'm'")


@pytest.mark.parametrize("count", [1, 3])
def test_raw_contents_must_hold_every_input(count: int) -> None:
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="INT8", shape=[1])
    req.inputs.add(name="y", datatype="INT8", shape=[1])
    req.raw_input_contents.extend([b"\1"] * count)
    rejected(req, f"raw_input_contents holds {count} tensor\\(s\\) but the request for model 'm' has 2 input")


def test_input_without_data() -> None:
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="INT8", shape=[1])
    rejected(req, "unable to find data for input tensor 'x' for model 'm' in request")


# --- requests: typed contents -----------------------------------------------------------

TYPED = [
    ("BOOL", "bool_contents", [True, False, True]),
    ("INT8", "int_contents", [-128, 5, 127]),
    ("INT16", "int_contents", [-32768, 7, 32767]),
    ("INT32", "int_contents", [-(2**31), 0, 2**31 - 1]),
    ("INT64", "int64_contents", [-(2**63), 1, 2**63 - 1]),
    ("UINT8", "uint_contents", [0, 128, 255]),
    ("UINT16", "uint_contents", [0, 1, 65535]),
    ("UINT32", "uint_contents", [0, 1, 2**32 - 1]),
    ("UINT64", "uint64_contents", [0, 1, 2**64 - 1]),
    ("FP32", "fp32_contents", [0.5, -1.25, 3e38]),
    ("FP64", "fp64_contents", [0.1, -1e300, 2.5]),
]


@pytest.mark.parametrize(("datatype", "field", "values"), TYPED, ids=[t[0] for t in TYPED])
def test_typed_contents_become_arrays_of_the_datatype(datatype: str, field: str, values: list[Any]) -> None:
    (inp,) = codec.to_infer_call(typed_request(datatype, field, values, [1, 3])).inputs
    assert inp.shape == [1, 3]
    assert isinstance(inp.data, np.ndarray)
    assert inp.data.dtype == numpy_dtype(datatype)
    assert inp.data.tolist() == np.array(values, dtype=numpy_dtype(datatype)).tolist()


def test_typed_bytes_contents() -> None:
    values = [b"a", b"", b"\x00\xffxyz"]
    (inp,) = codec.to_infer_call(typed_request("BYTES", "bytes_contents", values)).inputs
    assert isinstance(inp.data, np.ndarray)
    assert inp.data.dtype == object
    assert inp.data.tolist() == values


def test_empty_typed_contents_is_an_empty_tensor() -> None:
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[0, 4]).contents.SetInParent()
    (inp,) = codec.to_infer_call(req).inputs
    assert isinstance(inp.data, np.ndarray)
    assert (inp.data.dtype, inp.data.size) == (np.float32, 0)


def test_typed_contents_in_the_wrong_field() -> None:
    rejected(
        typed_request("INT32", "fp32_contents", [1.0]),
        "unexpected explicit tensor data for input tensor 'x' for model 'm' of type 'FP32', "
        "expected datatype 'INT32'",
    )


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_only_via_raw(datatype: str) -> None:
    rejected(typed_request(datatype, "fp32_contents", [1.0]), "can only be sent in raw_input_contents")


def test_typed_contents_in_two_fields() -> None:
    req = typed_request("INT32", "int_contents", [1])
    req.inputs[0].contents.int64_contents.append(2)
    rejected(req, "more than one contents field \\(int_contents, int64_contents\\)")


# --- requests: parameters ------------------------------------------------------------------


def test_tritonclient_reserved_and_custom_parameters() -> None:
    x = tg.InferInput("x", [1], "INT32").set_data_from_numpy(np.array([1], np.int32))
    buf = client_request(
        [x],
        sequence_id=42,
        sequence_start=True,
        sequence_end=False,
        priority=3,
        timeout=5000,
        parameters={"s": "v", "b": True, "i": -7, "f": 0.25},
    )
    assert call_of(buf).parameters == {
        "sequence_id": 42,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 3,
        "timeout": 5000,
        "s": "v",
        "b": True,
        "i": -7,
        "f": 0.25,
    }


def test_string_sequence_id_and_uint64_parameter() -> None:
    req = typed_request("INT32", "int_contents", [1])
    req.parameters["sequence_id"].string_param = "abc"
    req.parameters["big"].uint64_param = 2**64 - 1
    req.parameters["triton_enable_empty_final_response"].bool_param = True
    params = codec.to_infer_call(req).parameters
    assert params == {"sequence_id": "abc", "big": 2**64 - 1, "triton_enable_empty_final_response": True}
    assert isinstance(params["triton_enable_empty_final_response"], bool)


@pytest.mark.parametrize(
    ("key", "kind", "value", "match"),
    [
        ("sequence_start", "int64_param", 1, "invalid value type for 'sequence_start' parameter, expected bool_param"),
        ("timeout", "string_param", "1", "invalid value type for 'timeout' parameter, expected int64_param"),
        ("sequence_id", "bool_param", True, "invalid value type for 'sequence_id' parameter"),
        ("priority", "int64_param", -1, "invalid value for 'priority', expected value >= 0"),
        ("triton_custom", "bool_param", True, "parameter keys starting with 'triton_' are reserved"),
    ],
)
def test_reserved_parameters_are_checked(key: str, kind: str, value: Any, match: str) -> None:
    req = typed_request("INT32", "int_contents", [1])
    setattr(req.parameters[key], kind, value)
    rejected(req, match)


def test_parameter_without_a_value() -> None:
    req = typed_request("INT32", "int_contents", [1])
    req.parameters["empty"].SetInParent()
    rejected(req, "invalid value type for 'empty' parameter")


def test_input_parameters_are_passed_on() -> None:
    req = typed_request("INT32", "int_contents", [1])
    req.inputs[0].parameters["note"].string_param = "n"
    assert codec.to_infer_call(req).inputs[0].parameters == {"note": "n"}


def test_tritonclient_requested_outputs() -> None:
    x = tg.InferInput("x", [1], "INT32").set_data_from_numpy(np.array([1], np.int32))
    outputs = [tg.InferRequestedOutput("plain"), tg.InferRequestedOutput("top", class_count=3)]
    call = call_of(client_request([x], outputs))
    assert [(o.name, o.classification, o.parameters) for o in call.outputs] == [
        ("plain", 0, {}),
        ("top", 3, {}),
    ]


def test_output_binary_data_parameter_is_ignored() -> None:
    req = typed_request("INT32", "int_contents", [1])
    out = req.outputs.add(name="y")
    out.parameters["binary_data"].bool_param = True
    (requested,) = codec.to_infer_call(req).outputs  # type: ignore[misc]
    assert (requested.classification, requested.parameters) == (0, {})


def test_shared_memory_tensors_carry_their_placement() -> None:
    x = tg.InferInput("x", [1], "INT32")
    x.set_shared_memory("region0", 4, offset=8)
    y = tg.InferInput("y", [1], "INT32").set_data_from_numpy(np.array([7], np.int32))
    out = tg.InferRequestedOutput("z")
    out.set_shared_memory("region1", 16)
    call = call_of(client_request([x, y], [out]))
    sx, sy = call.inputs
    assert (sx.data, sx.shm) == (None, ShmPlacement("region0", 8, 4))
    assert sx.parameters == {}
    # raw_input_contents holds only the inline input: indexes skip the shm one.
    assert sy.shm is None and bytes(sy.data) == np.array([7], np.int32).tobytes()
    assert call.outputs is not None and call.outputs[0].shm == ShmPlacement("region1", 0, 16)


def test_shared_memory_needs_a_byte_size() -> None:
    req = typed_request("INT32", "int_contents", [1])
    req.inputs[0].ClearField("contents")
    req.inputs[0].parameters["shared_memory_region"].string_param = "r"
    with pytest.raises(ConveyorError, match="no 'shared_memory_byte_size'") as err:
        codec.to_infer_call(req)
    assert err.value.status == Status.INVALID_ARG


# --- responses -----------------------------------------------------------------------------


class TrackedResult(InferResult):
    released = 0

    def release(self) -> None:
        self.released += 1


def output(name: str, array: np.ndarray, datatype: str) -> OutputTensor:
    raw = serialize_bytes(array) if datatype == "BYTES" else array.tobytes()
    return OutputTensor(name, datatype, list(array.shape), np.frombuffer(raw, np.uint8))


def result_of(*outputs: OutputTensor, parameters: dict[str, Any] | None = None) -> TrackedResult:
    return TrackedResult("m", "3", "req-1", list(outputs), parameters or {}, [], None)  # type: ignore[arg-type]


OUTPUTS = {
    "F": (np.arange(6, dtype=np.float32).reshape(2, 3), "FP32"),
    "I": (np.array([[-1, 2**40]], dtype=np.int64), "INT64"),
    "B": (np.array([True, False]), "BOOL"),
    "H": (np.array([0.5, -2.0], dtype=np.float16), "FP16"),
    "E": (np.zeros((0, 3), dtype=np.int32), "INT32"),
    "S": (np.array([[b"cat:1", b""], ["é".encode(), b"\x00"]], dtype=object), "BYTES"),
}


@pytest.mark.parametrize("stream", [False, True])
def test_tritonclient_reads_our_response(stream: bool) -> None:
    result = result_of(
        *(output(name, array, dt) for name, (array, dt) in OUTPUTS.items()),  # type: ignore[arg-type]
        parameters={"flag": True, "n": 3, "x": 0.5, "s": "t", "u": 2**64 - 1},
    )
    buf = codec.encode_infer_response(result, stream=stream)
    assert result.released == 1
    if stream:
        message = tpb.ModelStreamInferResponse.FromString(buf)
        assert message.error_message == ""
        response = message.infer_response
    else:
        response = tpb.ModelInferResponse.FromString(buf)
    parsed = tg.InferResult(response)
    for name, (array, _) in OUTPUTS.items():
        got = parsed.as_numpy(name)
        assert got.shape == array.shape  # type: ignore[attr-defined]
        assert got.tolist() == array.tolist()  # type: ignore[attr-defined]
    meta = parsed.get_response()
    assert (meta.model_name, meta.model_version, meta.id) == ("m", "3", "req-1")
    assert [(o.name, o.datatype) for o in meta.outputs] == [(n, dt) for n, (_, dt) in OUTPUTS.items()]
    params = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in meta.parameters.items()}
    assert params == {"flag": True, "n": 3, "x": 0.5, "s": "t", "u": 2**64 - 1}
    assert meta.parameters["u"].WhichOneof("parameter_choice") == "uint64_param"


def test_response_matches_protobufs_own_serialization() -> None:
    result = result_of(output("F", np.arange(300, dtype=np.float64), "FP64"))
    expected = pb.ModelInferResponse(model_name="m", model_version="3", id="req-1")
    expected.outputs.add(name="F", datatype="FP64", shape=[300])
    expected.raw_output_contents.append(np.arange(300, dtype=np.float64).tobytes())
    assert codec.encode_infer_response(result) == expected.SerializeToString()


def test_result_is_released_when_encoding_fails() -> None:
    bad = OutputTensor("F", "FP32", [1], object())  # type: ignore[arg-type]
    result = result_of(bad)
    with pytest.raises(TypeError):
        codec.encode_infer_response(result)
    assert result.released == 1


def test_stream_error_is_in_band_with_the_request_id() -> None:
    message = tpb.ModelStreamInferResponse.FromString(codec.encode_stream_error("boom", "r9"))
    assert message.error_message == "boom"
    assert message.infer_response.id == "r9"


# --- metadata ------------------------------------------------------------------------------


def test_server_metadata() -> None:
    msg = codec.server_metadata_response({"name": "triton", "version": "1.0", "extensions": ["a", "b"]})
    assert (msg.name, msg.version, list(msg.extensions)) == ("triton", "1.0", ["a", "b"])


def test_model_metadata_from_triton_json() -> None:
    meta = {
        "name": "m",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "y", "datatype": "BYTES", "shape": [-1]}],
        "extra": "ignored",
    }
    msg = tpb.ModelMetadataResponse.FromString(codec.model_metadata_response(meta).SerializeToString())
    assert (msg.name, list(msg.versions), msg.platform) == ("m", ["1", "2"], "onnxruntime_onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in msg.inputs] == [("x", "FP32", [-1, 3])]
    assert [(t.name, t.datatype, list(t.shape)) for t in msg.outputs] == [("y", "BYTES", [-1])]


def test_model_config_from_triton_json() -> None:
    config = {
        "name": "m",
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3], "optional": False}],
        "output": [{"name": "y", "data_type": "TYPE_STRING", "dims": ["-1"]}],
        "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 100},
        "instance_group": [{"name": "g", "kind": "KIND_CPU", "count": 2}],
        "version_policy": {"latest": {"num_versions": 1}},
        "parameters": {"k": {"string_value": "v"}},
        "unknown_field": {"a": 1},
    }
    msg = tpb.ModelConfigResponse.FromString(codec.model_config_response(config).SerializeToString())
    c = msg.config
    assert (c.name, c.platform, c.backend, c.max_batch_size) == ("m", "onnxruntime_onnx", "onnxruntime", 8)
    assert (c.input[0].name, c.input[0].data_type, list(c.input[0].dims)) == ("x", 11, [3])  # TYPE_FP32
    assert (c.output[0].data_type, list(c.output[0].dims)) == (13, [-1])  # TYPE_STRING
    assert list(c.dynamic_batching.preferred_batch_size) == [4, 8]
    assert (c.instance_group[0].count, c.instance_group[0].kind) == (2, 2)  # KIND_CPU
    assert c.version_policy.latest.num_versions == 1
    assert c.parameters["k"].string_value == "v"


def test_model_statistics_from_triton_json() -> None:
    duration = {"count": 2, "ns": 1000}
    stats = {
        "model_stats": [
            {
                "name": "m",
                "version": "1",
                "last_inference": 1700000000000,
                "inference_count": 4,
                "execution_count": 2,
                "inference_stats": {"success": duration, "fail": {"count": 0, "ns": 0}, "queue": duration},
                "batch_stats": [{"batch_size": 2, "compute_infer": duration}],
                "memory_usage": [],
                "response_stats": {},
            }
        ]
    }
    msg = tpb.ModelStatisticsResponse.FromString(codec.model_statistics_response(stats).SerializeToString())
    (s,) = msg.model_stats
    assert (s.name, s.version, s.inference_count, s.execution_count) == ("m", "1", 4, 2)
    assert (s.inference_stats.success.count, s.inference_stats.queue.ns) == (2, 1000)
    assert s.batch_stats[0].batch_size == 2


def test_router_json_that_does_not_fit_is_internal() -> None:
    with pytest.raises(ConveyorError, match="model config does not fit") as err:
        codec.model_config_response({"max_batch_size": "many"})
    assert err.value.status == Status.INTERNAL
