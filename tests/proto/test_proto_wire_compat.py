"""Wire compatibility of conveyor.proto with Triton, as shipped in tritonclient.

tritonclient's generated modules (``tritonclient.grpc.service_pb2`` and
``model_config_pb2``) are the reference: every message, enum, service and RPC
they define must exist in ours with the same full name, and every field must
agree in name, number, type, cardinality, message/enum type and oneof.

Both sets of modules are imported into this one process, which also checks
that ours live in a private descriptor pool and do not collide with
tritonclient's symbols in the default pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf import descriptor as _d
from google.protobuf import descriptor_pool, json_format, text_format
from google.protobuf.unknown_fields import UnknownFieldSet

from conveyor.proto import (
    grpc_service_pb2,
    grpc_service_pb2_grpc,
    health_pb2,
    health_pb2_grpc,
    model_config_pb2,
)
from conveyor.proto._pool import POOL

LEVEL = "unit"

triton_service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
triton_model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")

PAIRS = [
    pytest.param(triton_service_pb2.DESCRIPTOR, grpc_service_pb2.DESCRIPTOR, id="grpc_service"),
    pytest.param(triton_model_config_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR, id="model_config"),
]


# ----------------------------------------------------------------- signatures
# Each descriptor is reduced to a flat {key: value} dict so that differences
# can be listed one per line.


def _is_repeated(field: _d.FieldDescriptor) -> bool:
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return bool(field.label == _d.FieldDescriptor.LABEL_REPEATED)


def _is_required(field: _d.FieldDescriptor) -> bool:
    if hasattr(field, "is_required"):
        return bool(field.is_required)
    return bool(field.label == _d.FieldDescriptor.LABEL_REQUIRED)


def _walk_messages(messages: Any) -> Iterator[_d.Descriptor]:
    for message in messages:
        yield message
        yield from _walk_messages(message.nested_types)


def _walk_enums(fd: _d.FileDescriptor) -> Iterator[_d.EnumDescriptor]:
    yield from fd.enum_types_by_name.values()
    for message in _walk_messages(fd.message_types_by_name.values()):
        yield from message.enum_types


def _field_signature(field: _d.FieldDescriptor) -> dict[str, object]:
    oneof = field.containing_oneof
    return {
        "number": field.number,
        "type": field.type,
        "repeated": _is_repeated(field),
        "required": _is_required(field),
        "has_presence": field.has_presence,
        "message_type": field.message_type.full_name if field.message_type else None,
        "enum_type": field.enum_type.full_name if field.enum_type else None,
        "oneof": oneof.name if oneof is not None else None,
        "json_name": field.json_name,  # type: ignore[attr-defined]
    }


def _message_signature(message: _d.Descriptor) -> dict[str, object]:
    sig: dict[str, object] = {"<message>": True, "<map_entry>": message.GetOptions().map_entry}
    for field in message.fields:
        sig[f"field {field.name}"] = _field_signature(field)
    for oneof in message.oneofs:
        sig[f"oneof {oneof.name}"] = sorted(f.name for f in oneof.fields)
    return sig


def _enum_signature(enum: _d.EnumDescriptor) -> dict[str, object]:
    sig: dict[str, object] = {"<enum>": True}
    for value in enum.values:
        sig[f"value {value.name}"] = value.number
    return sig


def _service_signature(service: _d.ServiceDescriptor) -> dict[str, object]:
    sig: dict[str, object] = {"<service>": True}
    for method in service.methods:
        sig[f"rpc {method.name}"] = (
            method.input_type.full_name,
            method.output_type.full_name,
            f"client_streaming={method.client_streaming}",
            f"server_streaming={method.server_streaming}",
        )
    return sig


def file_signature(fd: _d.FileDescriptor) -> dict[str, dict[str, object]]:
    """Everything wire-relevant in one .proto file, keyed by symbol full name."""
    out: dict[str, dict[str, object]] = {
        f"file {fd.name}": {
            "package": fd.package,
            "syntax": getattr(fd, "syntax", None),
            "dependencies": sorted(dep.name for dep in fd.dependencies),
        }
    }
    for message in _walk_messages(fd.message_types_by_name.values()):
        out[message.full_name] = _message_signature(message)
    for enum in _walk_enums(fd):
        out[enum.full_name] = _enum_signature(enum)
    for service in fd.services_by_name.values():
        out[service.full_name] = _service_signature(service)
    return out


def diff_signatures(theirs: dict[str, dict[str, object]], ours: dict[str, dict[str, object]]) -> list[str]:
    problems: list[str] = []
    for symbol in sorted(theirs.keys() | ours.keys()):
        if symbol not in ours:
            problems.append(f"missing in conveyor: {symbol}")
            continue
        if symbol not in theirs:
            problems.append(f"extra in conveyor (not in tritonclient): {symbol}")
            continue
        t, o = theirs[symbol], ours[symbol]
        for key in sorted(t.keys() | o.keys()):
            if key not in o:
                problems.append(f"{symbol}: {key} missing in conveyor (tritonclient: {t[key]!r})")
            elif key not in t:
                problems.append(f"{symbol}: {key} extra in conveyor ({o[key]!r})")
            elif isinstance(t[key], dict) and isinstance(o[key], dict):
                tk, ok = t[key], o[key]
                assert isinstance(tk, dict) and isinstance(ok, dict)
                for attr in sorted(tk.keys() | ok.keys()):
                    if tk.get(attr) != ok.get(attr):
                        problems.append(
                            f"{symbol}: {key} {attr}: tritonclient={tk.get(attr)!r} conveyor={ok.get(attr)!r}"
                        )
            elif t[key] != o[key]:
                problems.append(f"{symbol}: {key}: tritonclient={t[key]!r} conveyor={o[key]!r}")
    return problems


# ---------------------------------------------------------------------- tests


@pytest.mark.parametrize(("theirs", "ours"), PAIRS)
def test_descriptors_match_tritonclient(theirs: _d.FileDescriptor, ours: _d.FileDescriptor) -> None:
    problems = diff_signatures(file_signature(theirs), file_signature(ours))
    assert not problems, f"{len(problems)} difference(s) from tritonclient:\n" + "\n".join(problems)


def test_signature_covers_everything() -> None:
    """Guard against the comparison silently comparing nothing."""
    sig = file_signature(triton_service_pb2.DESCRIPTOR)
    assert "inference.ModelInferRequest.InferInputTensor" in sig
    assert "inference.GRPCInferenceService" in sig
    assert sum(k.startswith("rpc ") for k in sig["inference.GRPCInferenceService"]) == 20
    sig = file_signature(triton_model_config_pb2.DESCRIPTOR)
    assert "inference.DataType" in sig
    assert "inference.ModelSequenceBatching.Control.Kind" in sig
    assert "inference.ModelConfig.ParametersEntry" in sig


def test_diff_reports_differences() -> None:
    theirs = file_signature(triton_service_pb2.DESCRIPTOR)
    ours = {k: dict(v) for k, v in file_signature(grpc_service_pb2.DESCRIPTOR).items()}
    ours["inference.ServerLiveResponse"]["field live"] = {
        **ours["inference.ServerLiveResponse"]["field live"],  # type: ignore[dict-item]
        "number": 2,
    }
    del ours["inference.ModelReadyRequest"]["field version"]
    del ours["inference.ServerReadyResponse"]
    problems = diff_signatures(theirs, ours)
    assert problems == [
        "inference.ModelReadyRequest: field version missing in conveyor (tritonclient: "
        + repr(theirs["inference.ModelReadyRequest"]["field version"])
        + ")",
        "inference.ServerLiveResponse: field live number: tritonclient=1 conveyor=2",
        "missing in conveyor: inference.ServerReadyResponse",
    ]


def test_private_pool() -> None:
    for module in (grpc_service_pb2, model_config_pb2, health_pb2):
        assert module.DESCRIPTOR.pool is POOL
    assert POOL is not descriptor_pool.Default()
    assert POOL.FindMessageTypeByName("inference.ModelInferRequest") is (
        grpc_service_pb2.ModelInferRequest.DESCRIPTOR
    )
    # tritonclient's copy is the one in the default pool.
    default_desc = descriptor_pool.Default().FindMessageTypeByName("inference.ModelInferRequest")
    assert default_desc is triton_service_pb2.ModelInferRequest.DESCRIPTOR


def test_triton_request_roundtrip() -> None:
    req = triton_service_pb2.ModelInferRequest(model_name="m", model_version="1", id="r1")
    req.parameters["sequence_id"].int64_param = 7
    req.parameters["priority"].uint64_param = 2
    tensor = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    tensor.parameters["binary_data_size"].int64_param = 16
    req.outputs.add(name="OUTPUT0").parameters["binary_data"].bool_param = True
    req.raw_input_contents.append(b"\x00" * 16)
    wire = req.SerializeToString(deterministic=True)

    ours = grpc_service_pb2.ModelInferRequest.FromString(wire)
    assert ours.SerializeToString(deterministic=True) == wire
    assert len(UnknownFieldSet(ours)) == 0
    assert ours.parameters["sequence_id"].WhichOneof("parameter_choice") == "int64_param"
    assert list(ours.inputs[0].shape) == [1, 4]
    assert json_format.MessageToDict(ours) == json_format.MessageToDict(req)


def test_model_config_text_and_json() -> None:
    pbtxt = """
        name: "resnet"
        backend: "onnxruntime"
        max_batch_size: 8
        input [{ name: "x" data_type: TYPE_FP32 dims: [3, -1, -1] }]
        output [{ name: "y" data_type: TYPE_FP32 dims: [1000] }]
        dynamic_batching { preferred_batch_size: [4, 8] max_queue_delay_microseconds: 100 }
        instance_group [{ kind: KIND_GPU count: 2 gpus: [0] }]
        parameters { key: "k" value { string_value: "v" } }
    """
    config = text_format.Parse(pbtxt, model_config_pb2.ModelConfig())
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    as_dict = json_format.MessageToDict(config, preserving_proto_field_name=True)
    assert as_dict["input"][0]["data_type"] == "TYPE_FP32"
    again = json_format.ParseDict(as_dict, model_config_pb2.ModelConfig())
    assert again == config
    theirs = triton_model_config_pb2.ModelConfig.FromString(config.SerializeToString())
    assert text_format.MessageToString(theirs) == text_format.MessageToString(config)


def test_grpc_modules() -> None:
    assert hasattr(grpc_service_pb2_grpc, "GRPCInferenceServiceServicer")
    assert hasattr(grpc_service_pb2_grpc, "add_GRPCInferenceServiceServicer_to_server")
    assert hasattr(health_pb2_grpc, "add_HealthServicer_to_server")


def test_health_service() -> None:
    service = health_pb2.DESCRIPTOR.services_by_name["Health"]
    assert service.full_name == "grpc.health.v1.Health"
    check = service.methods_by_name["Check"]
    assert check.input_type.full_name == "grpc.health.v1.HealthCheckRequest"
    assert check.output_type.full_name == "grpc.health.v1.HealthCheckResponse"
    assert not check.client_streaming and not check.server_streaming
    watch = service.methods_by_name["Watch"]
    assert not watch.client_streaming and watch.server_streaming
    status = health_pb2.HealthCheckResponse.ServingStatus
    assert {name: status.Value(name) for name in status.keys()} == {
        "UNKNOWN": 0,
        "SERVING": 1,
        "NOT_SERVING": 2,
        "SERVICE_UNKNOWN": 3,
    }
    assert health_pb2.HealthCheckRequest.DESCRIPTOR.fields_by_name["service"].number == 1
    assert health_pb2.HealthCheckResponse.DESCRIPTOR.fields_by_name["status"].number == 1


def test_tritonclient_talks_to_our_servicer() -> None:
    """A real gRPC round trip: tritonclient's client against our generated servicer."""
    from concurrent import futures

    import grpc
    import numpy as np

    tc = pytest.importorskip("tritonclient.grpc")

    class Servicer(grpc_service_pb2_grpc.GRPCInferenceServiceServicer):
        def ServerLive(self, request: Any, context: Any) -> Any:
            return grpc_service_pb2.ServerLiveResponse(live=True)

        def ModelConfig(self, request: Any, context: Any) -> Any:
            config = model_config_pb2.ModelConfig(name=request.name, max_batch_size=4)
            config.input.add(name="x", data_type=model_config_pb2.TYPE_FP32, dims=[2])
            return grpc_service_pb2.ModelConfigResponse(config=config)

        def ModelInfer(self, request: Any, context: Any) -> Any:
            x = np.frombuffer(request.raw_input_contents[0], dtype="<f4")
            response = grpc_service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
            response.outputs.add(name="y", datatype="FP32", shape=list(request.inputs[0].shape))
            response.raw_output_contents.append((x * 2).astype("<f4").tobytes())
            return response

    class Health(health_pb2_grpc.HealthServicer):
        def Check(self, request: Any, context: Any) -> Any:
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), server)
    health_pb2_grpc.add_HealthServicer_to_server(Health(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = tc.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        assert client.is_server_live()
        config = client.get_model_config("m", as_json=True)["config"]
        assert config["input"][0] == {"name": "x", "data_type": "TYPE_FP32", "dims": ["2"]}
        tensor = tc.InferInput("x", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([[1.0, 2.5]], dtype=np.float32))
        result = client.infer("m", [tensor], request_id="r7")
        assert result.get_response().id == "r7"
        np.testing.assert_array_equal(result.as_numpy("y"), np.array([[2.0, 5.0]], dtype=np.float32))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        client.close()
        server.stop(None)
