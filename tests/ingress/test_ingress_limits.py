"""The ingress limits (ingress/limits.py) and their flags: what a client meets past each."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conveyor.deploy.cli import build_parser
from conveyor.deploy.options import check_ingress_args
from conveyor.deploy.settings import ServeSettings
from conveyor.deploy.supervisor import Supervisor
from conveyor.ingress.dataplane import InferCall
from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.request_checks import InferInput
from tests.support.fuzz_data_plane import data_plane, send

LEVEL = "unit"


def fp32_call(count: int) -> InferCall:
    return InferCall("m", "", [InferInput("F", "FP32", [1, count], np.zeros(count, np.float32))])


def test_an_input_with_too_many_elements_is_invalid_arg() -> None:
    with data_plane(max_input_elements=4) as plane:
        send(plane, fp32_call(4))
        with pytest.raises(ConveyorError, match=r"input 'F' has 5 elements.*--max-input-elements") as err:
            send(plane, fp32_call(5))
    assert err.value.status == Status.INVALID_ARG


async def test_requests_past_the_in_flight_limit_are_unavailable() -> None:
    with data_plane(max_inflight=2) as plane:
        gate = asyncio.Event()
        answer = plane.link.infer

        async def held(request: m.InferRequest) -> m.InferResponse:
            await gate.wait()
            return await answer(request)

        plane.link.infer = held  # type: ignore[method-assign]
        running = [asyncio.create_task(plane.infer(fp32_call(1))) for _ in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(ConveyorError, match="too many requests in flight") as err:
            await plane.infer(fp32_call(1))
        assert err.value.status == Status.UNAVAILABLE
        gate.set()
        for task in running:
            (await task).release()
        (await plane.infer(fp32_call(1))).release()  # room again
        # A refused request (bad input) does not keep its slot either.
        for _ in range(3):
            with pytest.raises(ConveyorError, match="byte size mismatch"):
                await plane.infer(InferCall("m", "", [InferInput("F", "FP32", [1, 2], np.zeros(3, np.float32))]))
        (await plane.infer(fp32_call(1))).release()
        assert plane.link.refusals == [("m", "")] * 3  # type: ignore[attr-defined]  # each counted as a REJECTED failure of the model


def test_the_limit_flags_reach_every_process(tmp_path: object) -> None:
    args = build_parser().parse_args([
        "serve", "--max-input-elements", "64", "--max-inflight-requests", "8", "--http-max-body-bytes", "4096",
        "--max-client-shm-regions", "3", "--http-restricted-api", "model-repository,statistics:admin=s3cret",
        "--grpc-restricted-protocol", "inference:key=v", "--client-mistakes-as-400", "true",
    ])
    settings = ServeSettings.of(args)
    assert check_ingress_args(settings) == ""
    supervisor = Supervisor(settings)
    router = supervisor._router_child(["/models"])
    assert router.argv[router.argv.index("--max-client-shm-regions") + 1] == "3"
    for role in ("http-ingress", "grpc-ingress"):
        argv = supervisor._new_child(role).argv
        assert argv[argv.index("--max-input-elements") + 1] == "64"
        assert argv[argv.index("--max-inflight-requests") + 1] == "8"
        assert argv[argv.index("--http-max-body-bytes") + 1] == "4096"
        assert argv[argv.index("--http-restricted-api") + 1] == "model-repository,statistics:admin=s3cret"
        # What the supervisor passes on parses back to the same groups.
        again = build_parser().parse_args(["ingress", *argv[1:]])
        assert again.http_restricted_api == args.http_restricted_api
        assert again.grpc_restricted_protocol == args.grpc_restricted_protocol
        assert again.client_mistakes_as_400 is True


@pytest.mark.parametrize(("flags", "problem"), [
    (["--http-restricted-api", "health:k=v", "--http-restricted-api", "health,metadata:k2=v"], "more than one"),
    (["--grpc-use-ssl", "true"], "needs --grpc-server-cert"),
    (["--grpc-use-ssl-mutual", "true", "--grpc-server-cert", "c", "--grpc-server-key", "k"], "--grpc-root-cert"),
    (["--http-ssl-cert", "c"], "go together"),
    (["--grpc-use-ssl", "true", "--grpc-server-cert", "/nope.pem", "--grpc-server-key", "/nope.key"], "no such file"),
])
def test_ingress_flags_that_cannot_work_are_refused_at_start(flags: list[str], problem: str) -> None:
    assert problem in check_ingress_args(ServeSettings.of(build_parser().parse_args(["serve", *flags])))


@pytest.mark.parametrize("value", ["health", "health:k", ":k=v", "health,nope:k=v", "health:=v"])
def test_malformed_restricted_groups_are_usage_errors(value: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--http-restricted-api", value])


def test_json_past_its_limit_is_refused_with_advice() -> None:
    from conveyor.ingress.limits import check_json_size
    from conveyor.proto.errors import Status

    check_json_size(1000, 1000)
    check_json_size(10**9, 0)  # 0: off
    with pytest.raises(ConveyorError, match="binary tensor extension") as err:
        check_json_size(1001, 1000)
    assert err.value.status == Status.INVALID_ARG


def test_client_mistakes_render_as_triton_unless_asked_for_400() -> None:
    """Triton reports some client mistakes as INTERNAL: its clients assert 500 / INTERNAL, so that is the
    default; --client-mistakes-as-400 makes them 400 / INVALID_ARGUMENT. The OpenAI API is not Triton's."""
    from conveyor.ingress.openai.errors import status_of
    from conveyor.proto.errors import client_mistake, client_mistakes_as_400, grpc_code_name, http_status, triton_code

    mistake = client_mistake("Unable to parse 'data': Shape does not match true shape of 'data' field")
    assert (http_status(mistake.status), grpc_code_name(mistake.status)) == (500, "INTERNAL")
    assert triton_code(mistake.status) == Status.INTERNAL  # what a Python model's BLS call sees
    try:
        client_mistakes_as_400(True)
        assert (http_status(mistake.status), grpc_code_name(mistake.status)) == (400, "INVALID_ARGUMENT")
    finally:
        client_mistakes_as_400(False)
    assert status_of(mistake) == 400
