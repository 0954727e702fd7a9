"""``tritonserver``: Triton 2.51's command line, every flag of its ``--help``, parsed as
Triton parses it; and the command lines of Triton's own docs and Helm charts run
unchanged against a real group (tritonclient checks readiness and metadata)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time

import pytest

from conveyor.deploy.cli import build_parser, build_tritonserver_parser, tritonserver_main
from conveyor.deploy.example_repo import add_sub, write_model
from conveyor.deploy.options import grpc_keepalive_options
from conveyor.deploy.ports import free_port
from conveyor.deploy.settings import ServeSettings
from conveyor.deploy.triton_flags import unused_given
from conveyor.router.repository.backend_config import BackendConfig, parse_setting
from tests.support.group import wait_ready
from tests.support.tritonserver import Triton, repo_with_simple

LEVEL = "e2e"

# Every flag of `tritonserver --help` (Triton 2.51, r24.10: /work/shared/tools/real-triton
# /work/cache/triton --help), in its order, with a value of the type its help names.
TRITON_251_FLAGS: list[tuple[str, str | None]] = [
    ("--id", "triton-a"), ("--exit-timeout-secs", "30"),
    ("--log-verbose", "1"), ("--log-info", "true"), ("--log-warning", "false"), ("--log-error", "1"),
    ("--log-format", "ISO8601"), ("--log-file", "/tmp/triton.log"),
    ("--model-store", "/models"), ("--model-repository", "/models"), ("--exit-on-error", "false"),
    ("--disable-auto-complete-config", None), ("--strict-readiness", "false"), ("--model-control-mode", "explicit"),
    ("--repository-poll-secs", "15"), ("--load-model", "*"), ("--model-config-name", "h100"),
    ("--model-load-thread-count", "4"), ("--model-load-retry-count", "2"), ("--model-namespacing", "false"),
    ("--enable-peer-access", "true"),
    ("--allow-http", "true"), ("--http-address", "0.0.0.0"), ("--http-port", "8000"), ("--reuse-http-port", "0"),
    ("--http-header-forward-pattern", "x-.*"), ("--http-thread-count", "8"),
    ("--http-restricted-api", "model-repository:admin-key=admin-value"),
    ("--allow-grpc", "true"), ("--grpc-address", "0.0.0.0"), ("--grpc-port", "8001"), ("--reuse-grpc-port", "off"),
    ("--grpc-header-forward-pattern", "x-.*"), ("--grpc-infer-allocation-pool-size", "8"),
    ("--grpc-use-ssl", "false"), ("--grpc-use-ssl-mutual", "false"), ("--grpc-server-cert", "server.crt"),
    ("--grpc-server-key", "server.key"), ("--grpc-root-cert", "ca.crt"),
    ("--grpc-infer-response-compression-level", "high"),
    ("--grpc-keepalive-time", "10000"), ("--grpc-keepalive-timeout", "5000"),
    ("--grpc-keepalive-permit-without-calls", "1"), ("--grpc-http2-max-pings-without-data", "0"),
    ("--grpc-http2-min-recv-ping-interval-without-data", "5000"), ("--grpc-http2-max-ping-strikes", "0"),
    ("--grpc-max-connection-age", "60000"), ("--grpc-max-connection-age-grace", "5000"),
    ("--grpc-restricted-protocol", "model-repository:admin-key=admin-value"),
    ("--allow-sagemaker", "false"), ("--sagemaker-port", "8080"), ("--sagemaker-safe-port-range", "8000-8002"),
    ("--sagemaker-thread-count", "8"),
    ("--allow-vertex-ai", "false"), ("--vertex-ai-port", "8080"), ("--vertex-ai-thread-count", "8"),
    ("--vertex-ai-default-model", "simple"),
    ("--allow-metrics", "true"), ("--allow-gpu-metrics", "false"), ("--allow-cpu-metrics", "true"),
    ("--metrics-address", "127.0.0.1"), ("--metrics-port", "8002"), ("--metrics-interval-ms", "2000"),
    ("--metrics-config", "summary_latencies=true"),
    ("--trace-config", "rate=100"),
    ("--backend-directory", "/opt/tritonserver/backends"), ("--backend-config", "python,shm-default-byte-size=1048576"),
    ("--repoagent-directory", "/opt/tritonserver/repoagents"),
    ("--cache-config", "local,size=1048576"), ("--cache-directory", "/opt/tritonserver/caches"),
    ("--rate-limit", "execution_count"), ("--rate-limit-resource", "R1:10:0"),
    ("--pinned-memory-pool-byte-size", "268435456"), ("--cuda-memory-pool-byte-size", "0:67108864"),
    ("--cuda-virtual-address-size", "0:1073741824"), ("--min-supported-compute-capability", "6.0"),
    ("--buffer-manager-thread-count", "0"), ("--host-policy", "gpu_0,numa-node=0"),
    ("--model-load-gpu-limit", "0:0.8"),
    ("--strict-model-config", "false"), ("--response-cache-byte-size", "1048576"),
    ("--trace-file", "/tmp/trace.json"), ("--trace-level", "TIMESTAMPS"), ("--trace-rate", "1000"),
    ("--trace-count", "-1"), ("--trace-log-frequency", "0"),
]


# Triton's flags added after 2.51, each with the release that added it (triton-inference-server/server
# src/command_line_parser.cc).
TRITON_LATER_FLAGS: list[tuple[str, str | None]] = [
    ("--http-max-input-size", "1048576"),  # 2.59: the HTTP request's JSON and decompressed size
    ("--grpc-infer-thread-count", "4"),  # added in 2025: accepted, logged as having no work to do here
    ("--grpc-max-response-pool-size", "64"),  # added in 2025: the same
]


def test_the_flag_list_is_the_whole_help_text() -> None:
    """The list above is every flag of the help (but --help itself), each once."""
    flags = [f for f, _ in TRITON_251_FLAGS]
    assert len(flags) == len(set(flags)) == 86


@pytest.mark.parametrize(("flag", "value"), TRITON_251_FLAGS + TRITON_LATER_FLAGS,
                         ids=[f for f, _ in TRITON_251_FLAGS + TRITON_LATER_FLAGS])
def test_every_triton_flag_is_accepted_in_both_forms(flag: str, value: str | None) -> None:
    parser = build_tritonserver_parser()
    forms = [[flag]] if value is None else [[f"{flag}={value}"], [flag, value]]
    for form in forms:
        parser.parse_args(["--model-repository=/models", *form])


def test_booleans_parse_as_triton_parses_them() -> None:
    parser = build_tritonserver_parser()
    for text, expected in (("true", True), ("On", True), ("1", True), ("FALSE", False), ("off", False), ("0", False)):
        assert parser.parse_args([f"--allow-gpu-metrics={text}"]).allow_gpu_metrics is expected
    with pytest.raises(SystemExit):
        parser.parse_args(["--allow-gpu-metrics=maybe"])
    assert parser.parse_args(["--log-verbose=true"]).log_verbose == 1


def test_modes_are_read_in_any_case_as_triton_reads_them() -> None:
    """Triton lowercases --model-control-mode and --rate-limit (qa/L0_iterative_sequence starts its server with
    --model-control-mode=EXPLICIT)."""
    parser = build_tritonserver_parser()
    args = parser.parse_args(["--model-control-mode=EXPLICIT", "--rate-limit=Execution_Count"])
    assert (args.model_control_mode, args.rate_limit) == ("explicit", "execution_count")
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-control-mode=sometimes"])


def test_tritonserver_takes_tritons_defaults() -> None:
    a = build_tritonserver_parser().parse_args(["--model-repository=/models"])
    assert (a.exit_on_error, a.strict_readiness, a.allow_client_shm, a.server_id) == (True, True, True, "triton")
    assert (a.http_port, a.grpc_port, a.metrics_port, a.exit_timeout_secs) == (8000, 8001, 8002, 30)
    assert a.drain_grace_secs == 0  # SIGTERM refuses at once, as Triton (conveyor serve: 5 s)
    assert build_parser().parse_args(["serve"]).drain_grace_secs == 5
    # Triton pads a direct sequence batch's empty slots (qa/L0_sequence_batcher asserts its batch sizes)
    assert a.sequence_slot_padding is True
    assert build_parser().parse_args(["serve"]).sequence_slot_padding is False


def test_repeatable_flags_keep_every_value() -> None:
    a = build_tritonserver_parser().parse_args([
        "--model-repository=/a", "--model-store", "/b", "--model-control-mode=explicit", "--load-model=x",
        "--load-model", "y", "--backend-config=onnxruntime,intra_op_thread_count=2", "--backend-config",
        "default-max-batch-size=8", "--rate-limit-resource=R1:1", "--rate-limit-resource=R2:2:0",
        "--host-policy=a,numa-node=0", "--host-policy=b,cpu-cores=0-3", "--model-load-gpu-limit=0:0.5",
        "--model-load-gpu-limit=1:0.5"])
    assert a.model_repository == ["/a", "/b"] and a.load_model == ["x", "y"]
    assert len(a.backend_config) == 2 and len(a.rate_limit_resource) == 2
    assert len(unused_given(a)) == 2  # host policies and GPU limits: one line each, all values


def test_deprecated_flags_become_what_they_stand_for(capsys: pytest.CaptureFixture[str]) -> None:
    from conveyor.deploy.cli import _fold_triton_aliases

    parser = build_tritonserver_parser()
    a = parser.parse_args(["--trace-level=TIMESTAMPS", "--trace-level=TENSORS", "--trace-rate=5", "--trace-count=3",
                           "--trace-file=/tmp/t.json", "--trace-log-frequency=2", "--response-cache-byte-size=4096",
                           "--disable-auto-complete-config"])
    _fold_triton_aliases(parser, a)
    assert a.trace_config == ["level=TIMESTAMPS", "level=TENSORS", "rate=5", "count=3", "triton,file=/tmp/t.json",
                              "triton,log-frequency=2"]
    assert a.cache_config == ["local,size=4096"] and a.strict_model_config is True
    # --trace-config wins over a deprecated flag naming the same setting, as in Triton.
    a = parser.parse_args(["--trace-rate=5", "--trace-config=rate=7"])
    _fold_triton_aliases(parser, a)
    assert a.trace_config == ["rate=7"]
    a = parser.parse_args(["--response-cache-byte-size=4096", "--cache-config=local,size=1"])
    with pytest.raises(SystemExit):
        _fold_triton_aliases(parser, a)
    assert "Incompatible flags --response-cache-byte-size and --cache-config" in capsys.readouterr().err


@pytest.mark.parametrize("entry", ["tritonserver", "conveyor serve"])
def test_http_max_input_size_sets_the_limits_it_stands_for(entry: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Triton's one bound on an HTTP request (its JSON, and the body decompressed) is Conveyor's
    --max-json-bytes and --http-max-body-bytes: it sets each that is left at its default."""
    from conveyor.deploy.cli import _fold_triton_aliases
    from conveyor.ingress.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_BYTES

    parser = build_tritonserver_parser() if entry == "tritonserver" else build_parser()
    head = ["--model-repository=/m"] if entry == "tritonserver" else ["serve", "--model-repository=/m"]

    def parsed(*argv: str) -> tuple[int, int]:
        a = parser.parse_args([*head, *argv])
        _fold_triton_aliases(parser, a)
        settings = ServeSettings.of(a)
        assert settings.http_max_input_size is None  # folded: nothing of it is handed on
        return settings.max_json_bytes, settings.http_max_body_bytes

    assert parsed() == (DEFAULT_MAX_JSON_BYTES, DEFAULT_MAX_BODY_BYTES)
    assert parsed("--http-max-input-size=4096") == (4096, 4096)
    assert parsed("--http-max-input-size", str(2 << 30)) == (2 << 30, 2 << 30)
    assert parsed("--http-max-input-size=4096", "--max-json-bytes=100") == (100, 4096)
    assert parsed("--http-max-body-bytes=8192", "--http-max-input-size=4096") == (4096, 8192)
    for value in ("0", "-1"):
        with pytest.raises(SystemExit):
            parsed(f"--http-max-input-size={value}")
        assert "Error: --http-max-input-size must be greater than 0." in capsys.readouterr().err


@pytest.mark.parametrize(("limit", "words"), [
    ("-1:0.6", "Invalid argument - expects device ID >= 0, got -1"),
    ("0:-0.4", "Invalid argument - expects limit fraction to be in range [0.0, 1.0], got -0.400000"),
])
def test_a_gpu_limit_triton_refuses_stops_the_start(limit: str, words: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """L0_lifecycle's test_load_gpu_limit: Triton checks the values though Conveyor does not use them."""
    assert tritonserver_main(["--model-repository=/models", "--model-load-gpu-limit", limit]) == 1
    assert f"error: setting model load GPU limit: {words}" in capsys.readouterr().err


def test_triton_refusals() -> None:
    assert tritonserver_main([]) == 1  # Triton: "--model-repository must be specified"
    with pytest.raises(SystemExit):
        tritonserver_main(["--model-repository=/models", "--load-model=x"])  # needs explicit mode
    with pytest.raises(ValueError, match="No backend specified"):
        parse_setting(",a=b")
    with pytest.raises(ValueError, match="option format is"):
        parse_setting("python,shm-default-byte-size")


def test_backend_config_settings() -> None:
    from conveyor.proto import model_config_pb2 as mc

    cfg = BackendConfig.parse(["default-max-batch-size=16", "onnxruntime,default-max-batch-size=0",
                               "onnxruntime,intra_op_thread_count=3", "python,stub-timeout-seconds=30",
                               "pytorch,weird=1", "nosuch,x=1"])
    assert cfg.default_max_batch_size("onnxruntime") == 0  # the backend's own setting wins
    assert cfg.default_max_batch_size("python") == 16
    config = mc.ModelConfig()
    cfg.apply("onnxruntime", config)
    assert config.parameters["intra_op_thread_count"].string_value == "3"
    lines = cfg.unused_settings()
    assert len(lines) == 3 and all("accepted, not used by Conveyor because" in line for line in lines)
    assert "no stub process" in lines[0] and "no Conveyor backend reads it" in lines[1]
    assert "no backend by that name" in lines[2]


def test_grpc_keepalive_flags_become_server_options() -> None:
    a = build_tritonserver_parser().parse_args(["--grpc-keepalive-time=10000", "--grpc-max-connection-age=60000",
                                                "--grpc-keepalive-permit-without-calls=true"])
    options = dict(grpc_keepalive_options(ServeSettings.of(a)))
    assert options["grpc.keepalive_time_ms"] == 10000 and options["grpc.max_connection_age_ms"] == 60000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.keepalive_timeout_ms"] == 20000  # Triton's default, passed on as Triton does
    assert "grpc.max_connection_age_grace_ms" not in options  # unset by default, as Triton


def test_unused_flags_are_logged_once_with_a_reason(caplog: pytest.LogCaptureFixture) -> None:
    from conveyor.deploy.triton_flags import log_unused

    a = build_tritonserver_parser().parse_args(["--pinned-memory-pool-byte-size=1", "--http-thread-count=16",
                                                "--cuda-memory-pool-byte-size=0:1"])
    with caplog.at_level(logging.WARNING, logger="conveyor.flags"):
        log_unused(ServeSettings.of(a), [])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert all(": accepted, not used by Conveyor because " in line for line in lines)


def test_the_load_thread_count_reaches_the_router() -> None:
    """--model-load-thread-count sizes the router's load threads (router/repository/agent.py)."""
    from conveyor.deploy.cli import build_parser
    from conveyor.deploy.options import model_control_args

    a = build_tritonserver_parser().parse_args(["--model-repository=/m", "--model-load-thread-count=2"])
    assert a.model_load_thread_count == 2 and unused_given(a) == []
    args = model_control_args(ServeSettings.of(a))
    assert args[args.index("--model-load-thread-count") + 1] == "2"
    router = build_parser().parse_args(["router", "--model-repository=/m", *args])
    assert router.model_load_thread_count == 2
    assert build_tritonserver_parser().parse_args(["--model-repository=/m"]).model_load_thread_count == 4
    with pytest.raises(SystemExit):
        build_tritonserver_parser().parse_args(["--model-repository=/m", "--model-load-thread-count=0"])


# --- against a running group --------------------------------------------------------------

DOC_LINES = [
    "tritonserver --model-repository=/models",  # the quickstart
    "tritonserver --model-repository=/models --model-control-mode=explicit --load-model=*",
    "tritonserver --model-repository=/models --log-verbose=1 --strict-model-config=false",
    # Helm charts (deploy/gcp, deploy/aws): --model-store and the three ports
    "tritonserver --model-store=/models --grpc-port=8001 --http-port=8000 --metrics-port=8002 "
    "--allow-gpu-metrics=false",
]


@pytest.mark.parametrize("line", DOC_LINES)
def test_doc_command_lines_serve(line: str, run_dir: str) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    server = Triton(line, repo_with_simple(run_dir), run_dir)
    try:
        wait_ready(server.http, server.proc, (server.grpc, server.metrics))
        http = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}")
        assert http.is_server_ready() and http.is_model_ready("simple")
        assert http.get_server_metadata()["name"] == "triton"
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
        assert grpc.is_server_ready()
        meta = grpc.get_server_metadata()
        assert meta.name == "triton" and "model_repository(unload_dependents)" in meta.extensions
        assert grpc.get_model_metadata("simple").name == "simple"
        # Closed first: as Triton's, a stopping tritonserver serves open HTTP connections until the exit timeout.
        http.close()
        grpc.close()
    finally:
        assert server.stop() == 0


def test_exit_on_error_is_tritons_default(run_dir: str) -> None:
    """A model that fails to load stops the server with a non-zero code, as Triton
    ("error: creating server: Internal - failed to load all models")."""
    server = Triton("tritonserver --model-repository=/models", repo_with_simple(run_dir, broken=True), run_dir)
    try:
        code = server.proc.wait(60)
    finally:
        server.stop()
    assert code == 1
    assert "failed to load all models" in server.output() and "bad_config" in server.output()
    # It exits then, as Triton: its workers do not wait out the exit timeout for a router that is gone.
    assert "Exit timeout expired" not in server.output() and "did not stop in time" not in server.output()


def test_a_refused_config_is_logged_as_triton_logs_it(run_dir: str) -> None:
    """Triton's L0_model_config greps the server log for ``^E[0-9][0-9][0-9][0-9].*<Triton's message>``: the
    glog-like line (level letter, MMDD, time, pid, file:line]) with the message as a JSON string."""
    repo = repo_with_simple(run_dir)
    write_model(repo, "reshape_elementcount0", 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                'input [{ name: "input" data_type: TYPE_FP32 dims: [4, 4] reshape: { shape: [ 2, 2 ] } }]\n'
                'output [{ name: "output" data_type: TYPE_FP32 dims: [16] }]\n')
    server = Triton("tritonserver --model-repository=/models --strict-model-config=true", repo, run_dir)
    try:
        assert server.proc.wait(60) == 1
    finally:
        server.stop()
    wanted = "model input 'input' has different size for dims and reshape for reshape_elementcount0"
    grep = subprocess.run(["grep", f"^E[0-9][0-9][0-9][0-9].*{wanted}", server.log], capture_output=True, text=True)
    assert grep.returncode == 0, server.output()
    assert re.match(r'E\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ \w+\.py:\d+\] ".*"$', grep.stdout.splitlines()[0])


def test_config_shows_tritons_cpu_defaults(run_dir: str) -> None:
    """Triton's normalized config on a CPU host (L0_model_config's onnx/cpu_instance): a KIND_CPU group without count
    runs Triton's default 2 instances of an ONNX model, and the pinned-memory defaults show."""
    import tritonclient.http as httpclient
    from onnx import TensorProto, helper

    from conveyor.deploy.example_repo import IR_VERSION, OPSET

    repo = repo_with_simple(run_dir)
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "g",
                              [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT16, [-1, -1, -1])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT16, [-1, -1, -1])])
    model = helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", OPSET)])
    write_model(repo, "cpu_instance", 'name: "cpu_instance"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                'instance_group { name: "cpu_instance" kind: KIND_CPU }', {"model.onnx": model.SerializeToString()})
    server = Triton("tritonserver --model-repository=/models --strict-model-config=false", repo, run_dir)
    try:
        wait_ready(server.http, server.proc, (server.grpc, server.metrics))
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}")
        config = client.get_model_config("cpu_instance")
        client.close()
        (group,) = config["instance_group"]
        assert (group["name"], group["kind"], group["count"]) == ("cpu_instance", "KIND_CPU", 2)
        optimization = config["optimization"]
        assert optimization["input_pinned_memory"] == optimization["output_pinned_memory"] == {"enable": True}
        assert config["default_model_filename"] == "model.onnx" and config["backend"] == "onnxruntime"
    finally:
        assert server.stop() == 0


def test_exit_on_error_false_serves_the_rest_not_ready_under_strict_readiness(run_dir: str) -> None:
    import tritonclient.http as httpclient

    server = Triton("tritonserver --model-repository=/models --exit-on-error=false --id=edge-7",
                    repo_with_simple(run_dir, broken=True), run_dir)
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}")
        deadline = time.monotonic() + 60
        while not _model_ready(client, "simple"):
            assert server.proc.poll() is None and time.monotonic() < deadline, server.output()
            time.sleep(0.2)
        # Strict readiness (Triton's default): a model that failed keeps the server not ready.
        time.sleep(1.0)
        assert not client.is_server_ready()
        assert client.get_server_metadata()["name"] == "edge-7"
        client.close()
    finally:
        assert server.stop() == 0


def test_http_max_input_size_bounds_a_requests_json_and_what_it_inflates_to(run_dir: str) -> None:
    """A small --http-max-input-size: a JSON request over it is refused in Triton's words, one that
    inflates past it too, and one under it is served."""
    import gzip
    import http.client
    import json

    limit = 4096
    server = Triton(f"tritonserver --model-repository=/models --http-max-input-size={limit}", repo_with_simple(run_dir),
                    run_dir)

    def infer(body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", server.http, timeout=30)
        try:
            conn.request("POST", "/v2/models/simple/infer", body=body,
                         headers={"Content-Type": "application/json", **(headers or {})})
            r = conn.getresponse()
            return r.status, json.loads(r.read()).get("error", "")
        finally:
            conn.close()

    data = list(range(16))
    request = json.dumps({"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": data}
                                     for n in ("INPUT0", "INPUT1")]}).encode()
    try:
        wait_ready(server.http, server.proc, (server.grpc, server.metrics))
        under = request + b" " * (limit - len(request))  # JSON may end in white space: exactly the limit
        assert infer(under) == (200, "")
        status, message = infer(under + b" ")
        assert status == 400 and message.startswith(  # Triton's words, then which of Conveyor's flags it set
            f"request JSON size of {limit + 1} bytes exceeds the maximum allowed input size of {limit} bytes. "
            "Use --http-max-input-size to increase the limit."), message
        bomb = gzip.compress(request + b" " * (64 * limit))  # a few hundred bytes that inflate to 256 KiB
        assert len(bomb) < limit
        status, message = infer(bomb, {"Content-Encoding": "gzip"})
        assert status == 400 and f"{limit} bytes" in message, message
        assert infer(gzip.compress(under), {"Content-Encoding": "gzip"}) == (200, "")
    finally:
        assert server.stop() == 0


def _model_ready(client: object, name: str) -> bool:
    try:
        return bool(client.is_model_ready(name))  # type: ignore[attr-defined]
    except Exception:
        return False


def test_config_fields_read_but_not_acted_on_are_named_once_per_load(caplog: pytest.LogCaptureFixture,
                                                                     tmp_path: object) -> None:
    from conveyor.router.lifecycle import ModelLifecycle
    from conveyor.router.registry import ModelRegistry

    repo = os.path.join(str(tmp_path), "models")
    add_sub(repo, "plain", 8)
    add_sub(repo, "fancy", 8, 'instance_group [{ count: 2 kind: KIND_CPU passive: true host_policy: "p0" }]\n'
                              'optimization { cuda { graphs: true } priority: PRIORITY_MAX }\n'
                              'model_repository_agents { agents [{ name: "checksum" }] }')
    with caplog.at_level(logging.WARNING, logger="conveyor.router.repository.config_unused"):
        ModelLifecycle(ModelRegistry(), [repo]).startup()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("model 'fancy': config fields read but not acted on")
    for field in ("model_repository_agents", "instance_group.passive", "instance_group.host_policy",
                  "optimization.cuda", "optimization.priority"):
        assert field in lines[0]


def test_sagemaker_without_a_default_model_name_serves_tritons_unspecified_name(run_dir: str) -> None:
    """Triton's server names the model 'unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME' when the variable is
    unset (its ``serve`` script picks the only model, not the server): qa/L0_sagemaker's ecs/eks case."""
    import json

    from tests.support.cloud_http import call

    sagemaker = free_port()
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("SAGEMAKER_")}
    try:
        server = Triton(f"tritonserver --model-repository=/models --allow-sagemaker=true "
                        f"--sagemaker-port={sagemaker}", repo_with_simple(run_dir), run_dir)
    finally:
        os.environ.update(saved)
    try:
        wait_ready(server.http, server.proc, (sagemaker,))
        status, _, body = call(sagemaker, "/invocations", b"dummy")
        assert (status, json.loads(body)) == (400, {
            "error": "Request for unknown model: 'unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME' is not found"})
        # Triton's lines for the endpoints started (qa/L0_vertex_ai and L0_sagemaker grep them).
        out = server.output()
        for line in (f"Started HTTPService at 127.0.0.1:{server.http}",
                     f"Started GRPCInferenceService at 127.0.0.1:{server.grpc}",
                     f"Started Sagemaker HTTPService at 127.0.0.1:{sagemaker}"):
            assert line in out
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize(("default", "second_model", "words"), [
    ("subadd", False, "Expect the default model 'subadd' is loaded"),
    ("", True, "Expect the model repository contains only a single model if default model is not specified"),
])
def test_vertex_ai_without_its_default_model_refuses_to_start(default: str, second_model: bool, words: str,
                                                               run_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's VertexAiAPIServer::Create checks the default model once the models are loaded: one that is not
    ready, or none named and not exactly one model, and ``tritonserver`` exits 1 (qa/L0_vertex_ai's two "Expect
    failed to start" checks grep these lines)."""
    monkeypatch.setenv("AIP_PREDICT_ROUTE", "/predict")
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/health")
    repo = repo_with_simple(run_dir)
    if second_model:
        add_sub(repo, "simple2", 8)
    flag = f" --vertex-ai-default-model={default}" if default else ""
    server = Triton(f"tritonserver --model-repository=/models --allow-vertex-ai=true "
                    f"--vertex-ai-port={free_port()}{flag}", repo, run_dir)
    try:
        code = server.proc.wait(90)
    finally:
        server.stop()
    out = server.output()
    assert code == 1, out
    assert f"failed to start Vertex AI service: Invalid argument - {words}" in out
    assert "did not stop in time" not in out


def test_vertex_ai_with_its_default_model_loaded_starts(run_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.cloud_http import call

    monkeypatch.setenv("AIP_PREDICT_ROUTE", "/predict")
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/health")
    repo = repo_with_simple(run_dir)
    add_sub(repo, "simple2", 8)
    vertex = free_port()
    server = Triton(f"tritonserver --model-repository=/models --allow-vertex-ai=true --vertex-ai-port={vertex} "
                    "--vertex-ai-default-model=simple2", repo, run_dir)
    try:
        wait_ready(server.http, server.proc, (vertex,))
        assert call(vertex, "/health")[0] == 200
        assert server.proc.poll() is None and "failed to start Vertex AI service" not in server.output()
    finally:
        assert server.stop() == 0
