"""The vLLM backend on the real engine (vLLM's CPU build), a tiny Llama built on the fly: a Triton
vllm_backend repository served as is; greedy outputs token for token those of vLLM's own
``LLM.generate`` through the gRPC stream and HTTP generate/generate_stream; plain infer; LoRA
adapters; a cancelled request (gRPC cancel, an HTTP generate or generate_stream client gone) aborted in the
engine, in Triton's log lines; the engine's ``vllm:`` metrics on /metrics (only where the config
asks); the backend's error words; vllm_backend's CI ensemble (batching) over the model (not
batching); a dead engine unloaded, its shared memory unlinked."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import re
import shutil
import signal
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import write_model
from conveyor.deploy.runtime.dispatch_cpu import bound_cpus
from conveyor.deploy.runtime.procs import children, mapped_shm
from conveyor.workers.backends.vllm import priority
from conveyor.workers.backends.vllm.backend import CANCELLED_LOG, CANCELLING_LOG
from tests.support import tiny_llama
from tests.support.group import Server, pids_of, router_control
from tests.support.vllm_group import EMBED_MODEL, FOLDER_ADAPTER, MODEL, VllmGroup, spend
from tests.support.vllm_reference import MAX_TOKENS, TRITON_PROMPTS
from tests.support.waiting import eventually

LEVEL = "e2e"

tiny_llama.require_vllm()

pytestmark = pytest.mark.timeout(300)

PROMPTS = TRITON_PROMPTS
ADAPTERS = ["", "alpha", "beta"]  # "": the base model


@pytest.fixture(scope="module")
def served(served_llm: VllmGroup) -> tuple[Server, Any]:
    """The session's vLLM group (tests/support/vllm_group.py, shared with the OpenAI tests), and vLLM's
    own ``LLM.generate`` outputs with model.json's engine arguments, per adapter."""
    assert served_llm.ref.triton.keys() == set(ADAPTERS)
    return served_llm.server, served_llm.ref.triton


def sampling(adapter: str, **more: Any) -> str:
    return json.dumps({"temperature": 0, "max_tokens": MAX_TOKENS, **({"lora_name": adapter} if adapter else {}),
                       **more})


def grpc_inputs(prompt: str, params: str, stream: bool, **flags: bool) -> list[grpcclient.InferInput]:
    def tensor(name: str, dtype: str, value: Any) -> grpcclient.InferInput:
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=object if dtype == "BYTES" else bool))
        return t

    inputs = [tensor("text_input", "BYTES", prompt.encode()), tensor("sampling_parameters", "BYTES", params.encode()),
              tensor("stream", "BOOL", stream)]
    return inputs + [tensor(name, "BOOL", value) for name, value in flags.items()]


def grpc_stream(srv: Server, requests: dict[str, list[grpcclient.InferInput]],
                cancel_after_first: bool = False) -> dict[str, list[Any]]:
    """Send every request on one stream at once; each id's responses (results, or the error) until its final."""
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for rid, inputs in requests.items():
            client.async_stream_infer(MODEL, inputs, request_id=rid, enable_empty_final_response=True)
        out: dict[str, list[Any]] = {rid: [] for rid in requests}
        open_ids = set(requests)
        while open_ids:
            result, error = got.get(timeout=60)
            if error is not None:
                rid = next(iter(open_ids)) if len(open_ids) == 1 else error.message()
                out.setdefault(rid, []).append(error)
                open_ids.discard(rid)
                continue
            response = result.get_response()
            out[response.id].append(result)
            if cancel_after_first:
                return out
            if response.parameters["triton_final_response"].bool_param:
                open_ids.discard(response.id)
        return out
    finally:
        client.stop_stream(cancel_requests=cancel_after_first)
        client.close()


def post(srv: Server, path: str, body: Any) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=60)
    try:
        conn.request("POST", f"/v2/models/{MODEL}/{path}", body=json.dumps(body))
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def get(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()


def metrics(srv: Server) -> dict[str, float]:
    text = get(srv.metrics_port, "/metrics").decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("vllm:") and f'model="{MODEL}",version="1"' in line:
            name, value = line.rsplit(" ", 1)
            found[name.split("{")[0] + ("" if "le=" not in name else name[name.index("le="):-1])] = float(value)
    return found


def test_a_triton_vllm_repository_is_served_as_is(served: tuple[Server, Any]) -> None:
    srv, _ = served
    config = json.loads(get(srv.http_port, f"/v2/models/{MODEL}/config"))
    assert config["model_transaction_policy"]["decoupled"] is True and config["max_batch_size"] == 0
    assert [i["name"] for i in config["input"]][:4] == ["text_input", "image", "stream", "sampling_parameters"]
    assert "text_output" in [o["name"] for o in config["output"]]


def test_grpc_stream_is_token_for_token_llm_generate(served: tuple[Server, Any]) -> None:
    """Each adapter's requests all at once on one stream, batched in flight by the engine. (Not base and
    adapters in one batch: vLLM's CPU build gets base rows wrong in a batch mixed with LoRA rows, in its
    own ``LLM.generate`` too.)"""
    srv, reference = served
    for a in ADAPTERS:
        requests = {f"{a}|{p}": grpc_inputs(p, sampling(a), True, exclude_input_in_output=True,
                                            return_num_output_tokens=True, return_finish_reason=True)
                    for p in PROMPTS}
        got = grpc_stream(srv, requests)
        for p, ref in zip(PROMPTS, reference[a], strict=True):
            results = got[f"{a}|{p}"]
            texts = [r.as_numpy("text_output") for r in results]
            assert "".join(t[0].decode() for t in texts if t is not None) == ref["text"], (a, p)
            counts = [int(r.as_numpy("num_output_tokens")[0]) for r in results if r.as_numpy("text_output") is not None]
            # Mostly one token a response; vLLM merges a request's outputs while its reader is behind (a
            # busy host), and a response then counts each token it carries.
            assert counts and all(c >= 1 for c in counts) and sum(counts) == len(ref["token_ids"]), (a, p, counts)


def test_generate_stream_is_token_for_token_llm_generate(served: tuple[Server, Any]) -> None:
    srv, reference = served
    for a in ADAPTERS:
        for p, ref in zip(PROMPTS, reference[a], strict=True):
            body = {"text_input": p, "stream": True, "sampling_parameters": sampling(a),
                    "return_num_output_tokens": True}
            status, raw = post(srv, "generate_stream", body)
            assert status == 200, raw
            events = [json.loads(line[5:]) for line in raw.decode().splitlines() if line.startswith("data:")]
            assert "".join(e["text_output"] for e in events) == ref["text"], (a, p)
            assert sum(e["num_output_tokens"] for e in events) == len(ref["token_ids"])


PAST_EOS = 40  # max_tokens with ignore_eos: the greedy answer (12 tokens at most) then many textless tokens


def test_generate_stream_logprobs_are_every_tokens_past_the_end_of_sequence(served: tuple[Server, Any]) -> None:
    """A response without text (a token after ``</s>`` with ``ignore_eos``) still comes, with its logprobs:
    the events' logprobs are one a token, the whole answer's."""
    srv, _ = served
    params = sampling("", max_tokens=PAST_EOS, ignore_eos=True, logprobs=1)
    events = []
    for stream in (True, False):
        body = {"text_input": PROMPTS[0], "stream": stream, "sampling_parameters": params, "return_logprobs": True,
                "exclude_input_in_output": True}
        status, raw = post(srv, "generate_stream", body)
        assert status == 200, raw
        events.append([json.loads(line[5:]) for line in raw.decode().splitlines() if line.startswith("data:")])
    streamed = [p for e in events[0] for p in json.loads(e["logprobs"])]
    (whole,) = events[1]
    positions = json.loads(whole["logprobs"])
    assert len(streamed) == len(positions) == PAST_EOS
    assert [list(p) for p in streamed] == [list(p) for p in positions]  # the same token ids, in order
    assert "</s>" in [next(iter(p.values()))["decoded_token"] for p in positions[:-1]]  # textless tokens follow


def test_one_response_when_not_streaming_with_the_prompt_first(served: tuple[Server, Any]) -> None:
    srv, reference = served
    prompt, ref = PROMPTS[0], reference["alpha"][0]
    # Triton's generate call: sampling parameters as request parameters.
    parameters = {"temperature": 0, "max_tokens": MAX_TOKENS, "lora_name": "alpha"}
    status, raw = post(srv, "generate", {"text_input": prompt, "parameters": parameters})
    assert status == 200, raw
    assert json.loads(raw)["text_output"] == prompt + ref["text"]
    got = grpc_stream(srv, {"one": grpc_inputs(prompt, sampling("alpha"), False, return_num_input_tokens=True)})["one"]
    with_outputs = [r for r in got if r.as_numpy("text_output") is not None]
    assert len(with_outputs) == 1 and with_outputs[0].as_numpy("text_output")[0].decode() == prompt + ref["text"]
    assert with_outputs[0].as_numpy("num_input_tokens")[0] > 0


def test_plain_infer_is_the_one_final_response(served: tuple[Server, Any]) -> None:
    """Triton refuses plain infer on any decoupled model; a vLLM model that does not stream answers once,
    so HTTP infer and gRPC ModelInfer serve it (``stream`` false or absent) with the whole text."""
    srv, reference = served
    prompt, ref = PROMPTS[1], reference["beta"][1]
    http = httpclient.InferenceServerClient(f"127.0.0.1:{srv.http_port}")
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        for stream in (False, None):
            values: dict[str, Any] = {"text_input": prompt.encode(), "sampling_parameters": sampling("beta").encode(),
                                      "return_finish_reason": True}
            if stream is not None:
                values["stream"] = stream
            for client in (grpcclient, httpclient):
                out = (grpc if client is grpcclient else http).infer(MODEL, plain_inputs(client, values))
                assert out.as_numpy("text_output")[0].decode() == prompt + ref["text"], (client, stream)
                assert out.as_numpy("finish_reason")[0].decode() in ("stop", "length")
        # A request that streams after all is still refused, in Triton's words.
        streamed = {"text_input": prompt.encode(), "stream": True, "exclude_input_in_output": True}
        with pytest.raises(InferenceServerException, match="doesn't support models with decoupled transaction policy"):
            grpc.infer(MODEL, plain_inputs(grpcclient, streamed))
        with pytest.raises(InferenceServerException, match="doesn't support models with decoupled transaction policy"):
            http.infer(MODEL, plain_inputs(httpclient, streamed))
    finally:
        http.close()
        grpc.close()


def plain_inputs(client: Any, values: dict[str, Any]) -> list[Any]:
    inputs = []
    for name, value in values.items():
        t = client.InferInput(name, [1], "BYTES" if isinstance(value, bytes) else "BOOL")
        t.set_data_from_numpy(np.array([value], dtype=object if isinstance(value, bytes) else bool))
        inputs.append(t)
    return inputs


def test_adapters_change_the_output(served: tuple[Server, Any]) -> None:
    _, reference = served
    base, alpha, beta = ([r["text"] for r in reference[a]] for a in ADAPTERS)
    assert base != alpha and base != beta and alpha != beta


def test_an_unknown_adapter_is_a_clear_invalid_argument(served: tuple[Server, Any]) -> None:
    srv, _ = served
    status, raw = post(srv, "generate", {"text_input": "hello", "sampling_parameters": sampling("zeta")})
    assert status == 400
    # multi_lora.json's adapters, then the one in the version's loras/ folder (tests/support/vllm_group.py)
    assert json.loads(raw)["error"] == (
        f"LoRA zeta is not supported, we currently support ['alpha', 'beta', '{FOLDER_ADAPTER}']")
    got = grpc_stream(srv, {"x": grpc_inputs("hello", sampling("zeta"), True)})
    (error,) = [e for e in got["x"] if isinstance(e, Exception)]
    assert "LoRA zeta is not supported" in str(error)
    status, raw = post(srv, "generate", {"text_input": "hello", "sampling_parameters": '{"temprature": 0}'})
    assert status == 400 and "temprature" in json.loads(raw)["error"]


def test_guided_decoding_as_triton_vllm_backend_users_send_it(served: tuple[Server, Any]) -> None:
    # Triton's vllm_backend reads ``guided_decoding`` (a JSON object, or its text) among the sampling
    # parameters; vLLM 0.11+ calls it ``structured_outputs``. Both constrain the engine's output.
    srv, _ = served
    cases: list[tuple[str, Any]] = [("guided_decoding", json.dumps({"choice": ["yes", "no"]})),
                                    ("structured_outputs", {"regex": "[a-c]{3}"})]
    for key, constraint in cases:
        params = {"temperature": 0, "max_tokens": 8, key: constraint}
        status, raw = post(srv, "generate", {"text_input": "hello", "exclude_input_in_output": True,
                                             "sampling_parameters": json.dumps(params)})
        assert status == 200, raw
        text = json.loads(raw)["text_output"]
        assert text in ("yes", "no") if key == "guided_decoding" else re.fullmatch("[a-c]{3}", text), (key, text)
    # A pattern the engine cannot compile, or two constraints at once: the request's fault, with the reason.
    bad: list[dict[str, Any]] = [{"regex": "[a-"}, {"choice": ["a"], "regex": "b"}]
    for constraint in bad:
        params = {"max_tokens": 8, "structured_outputs": constraint}
        status, raw = post(srv, "generate", {"text_input": "hello", "sampling_parameters": json.dumps(params)})
        assert status == 400, raw
        assert "regex" in json.loads(raw)["error"] or "one kind" in json.loads(raw)["error"], raw


LONG = {"temperature": 0, "max_tokens": 240, "ignore_eos": True}


def test_a_cancelled_stream_is_aborted_in_the_engine(served: tuple[Server, Any], served_llm: VllmGroup) -> None:
    srv, _ = served
    logged = served_llm.log.read_text().count(CANCELLED_LOG)
    before = metrics(srv).get("vllm:generation_tokens_total", 0.0)
    got = grpc_stream(srv, {"long": grpc_inputs("the quick", json.dumps(LONG), True, exclude_input_in_output=True)},
                      cancel_after_first=True)
    assert len(got["long"]) == 1
    assert_aborted(srv, before)
    # Triton's vllm_backend's log lines, which its CI (request_cancellation) reads in the server's log.
    eventually(lambda: served_llm.log.read_text().count(CANCELLED_LOG) > logged, 10, what="the cancel logged")
    text = served_llm.log.read_text()
    assert "INFO" in text[text.rindex(CANCELLING_LOG) - 120:] and text.rindex(CANCELLING_LOG) < text.rindex(
        CANCELLED_LOG)


def test_exclude_input_in_output_false_in_a_stream_is_the_backends_error(served: tuple[Server, Any]) -> None:
    srv, _ = served
    got = grpc_stream(srv, {"x": grpc_inputs("the quick", sampling(""), True, exclude_input_in_output=False)})
    (error,) = got["x"]
    assert error.message() == (
        "Error generating stream: When streaming, `exclude_input_in_output` = False is not allowed.")


def test_an_image_to_a_text_only_model_is_a_400_and_the_engine_serves_the_next(served: tuple[Server, Any]) -> None:
    """Triton's ``image`` input (base64) on the tiny Llama, which takes no images: refused before its engine."""
    srv, ref = served
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"  # 1x1
    for route in ("generate", "generate_stream"):
        status, raw = post(srv, route, {"text_input": "the quick", "image": [png], "sampling_parameters": sampling("")})
        assert status == 400 and f"model '{MODEL}' does not take images" in json.loads(raw)["error"]
    status, raw = post(srv, "generate", {"text_input": "the quick", "sampling_parameters": sampling(""),
                                         "exclude_input_in_output": True})
    assert status == 200 and json.loads(raw)["text_output"] == ref[""][0]["text"]


# vllm_backend's ci/L0_backend_vllm/vllm_backend/ensemble_config.pbtxt: a batching ensemble over the
# non-batching vLLM model.
ENSEMBLE = "vllm_ensemble"
ENSEMBLE_CONFIG = f"""name: "{ENSEMBLE}"
platform: "ensemble"
max_batch_size: 1
input [ {{ name: "text_input" data_type: TYPE_STRING dims: [ -1 ] }} ]
output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{MODEL}" model_version: -1
  input_map {{ key: "text_input" value: "text_input" }} output_map {{ key: "text_output" value: "text_output" }}
}} ] }}
"""


def test_a_batching_ensemble_runs_the_vllm_model(served: tuple[Server, Any]) -> None:
    """As Triton: the ensemble loads, its request's text_input [1, 1] reaches the model as [1], and its
    answer is the model's own ([1] back to [1, 1])."""
    srv, reference = served
    write_model(srv.repo, ENSEMBLE, ENSEMBLE_CONFIG)
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    try:
        client.load_model(ENSEMBLE)
        assert client.is_model_ready(ENSEMBLE)
        text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[PROMPTS[0].encode()]], dtype=object))
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(ENSEMBLE, [text], parameters={"temperature": 0, "max_tokens": MAX_TOKENS})
        result, error = got.get(timeout=60)
        assert error is None, error
        out = result.as_numpy("text_output")
        assert out.shape == (1, 1) and out[0, 0].decode() == PROMPTS[0] + reference[""][0]["text"]
    finally:
        client.stop_stream()
        client.unload_model(ENSEMBLE)
        client.close()
        shutil.rmtree(os.path.join(srv.repo, ENSEMBLE))


def test_engine_metrics_only_where_the_model_asks(served: tuple[Server, Any], served_llm: VllmGroup) -> None:
    """As Triton's vllm_backend: no vllm: series for a model without REPORT_CUSTOM_METRICS "true" (the pooling
    model), its engine at work; the model that asks has them (``test_engine_metrics_on_metrics``)."""
    srv, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", served_llm.openai_port, timeout=60)
    try:
        conn.request("POST", "/v1/embeddings", body=json.dumps({"model": EMBED_MODEL, "input": "hello world"}),
                     headers={"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    time.sleep(1.0)  # where they were made, the engine's series would be on /metrics by now (LAZY_METRICS_S 0.1)
    text = get(srv.metrics_port, "/metrics").decode()
    assert not [line for line in text.splitlines() if line.startswith("vllm:") and f'model="{EMBED_MODEL}"' in line]


@pytest.mark.parametrize("route", ["generate_stream", "generate"])
def test_an_http_client_that_goes_away_is_aborted_in_the_engine(served: tuple[Server, Any], route: str) -> None:
    """A stream's client leaves after its first event; ``generate``'s before its one answer, once the engine
    is making tokens for it."""
    srv, _ = served
    before = metrics(srv).get("vllm:generation_tokens_total", 0.0)
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=60)
    stream = route == "generate_stream"
    body = {"text_input": "the quick", "stream": stream, "sampling_parameters": json.dumps(LONG)}
    conn.request("POST", f"/v2/models/{MODEL}/{route}", body=json.dumps(body))
    if stream:
        r = conn.getresponse()
        assert r.status == 200 and r.readline().startswith(b"data:")
    else:
        eventually(lambda: metrics(srv).get("vllm:generation_tokens_total", 0.0) > before, 30,
                   what="the engine never began", interval=0.02)
    conn.close()
    assert_aborted(srv, before)


def assert_aborted(srv: Server, before: float) -> None:
    """The engine lets go of the request: nothing running, and far fewer than its 240 tokens made."""
    deadline = time.monotonic() + 30
    while True:
        now = metrics(srv)
        if now.get("vllm:num_requests_running") == 0 and now.get("vllm:generation_tokens_total", 0) > before:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.2)
    time.sleep(0.5)
    assert metrics(srv)["vllm:generation_tokens_total"] - before < LONG["max_tokens"]


def test_engine_metrics_on_metrics(served: tuple[Server, Any]) -> None:
    srv, _ = served
    post(srv, "generate", {"text_input": "hello world", "sampling_parameters": sampling("")})
    deadline = time.monotonic() + 10
    while not metrics(srv).get("vllm:e2e_request_latency_seconds_count"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    found = metrics(srv)
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count",
                 "vllm:time_per_output_token_seconds_count", "vllm:request_prompt_tokens_count",
                 "vllm:request_generation_tokens_count", "vllm:request_params_n_count"):
        assert found.get(name, 0) > 0, name
    assert "vllm:num_requests_running" in found and "vllm:num_requests_waiting" in found
    assert "vllm:kv_cache_usage_perc" in found  # what MAX_KV_CACHE_USAGE compares


def test_past_max_kv_cache_usage_a_request_is_refused_at_once(served: tuple[Server, Any]) -> None:
    """The limit set at run time (in place: the engine serves on), then a long request filling
    some KV cache: the next request is refused 503 with Retry-After until it is gone."""
    srv, _ = served
    client = httpclient.InferenceServerClient(srv.http_url)
    serving = [i["index"] for i in router_control(srv.group, "instances")]
    config = client.get_model_config(MODEL)
    limited = json.loads(json.dumps(config))
    limited.setdefault("parameters", {})["MAX_KV_CACHE_USAGE"] = {"string_value": "0.000001"}
    try:
        client.load_model(MODEL, config=json.dumps(limited))
        assert [i["index"] for i in router_control(srv.group, "instances")] == serving  # no second engine
        before = metrics(srv).get("vllm:generation_tokens_total", 0.0)
        conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=60)
        conn.request("POST", f"/v2/models/{MODEL}/generate_stream",
                     body=json.dumps({"text_input": "the quick", "stream": True,
                                      "sampling_parameters": json.dumps(LONG)}))
        r = conn.getresponse()
        assert r.status == 200 and r.readline().startswith(b"data:")
        deadline = time.monotonic() + 30
        while not metrics(srv).get("vllm:kv_cache_usage_perc"):
            assert time.monotonic() < deadline, "the engine never reported KV-cache use"
            time.sleep(0.05)
        refused = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=60)
        refused.request("POST", f"/v2/models/{MODEL}/generate",
                        body=json.dumps({"text_input": "hello world", "sampling_parameters": sampling("")}))
        answer = refused.getresponse()
        body = answer.read().decode()
        refused.close()
        assert answer.status == 503 and answer.getheader("Retry-After") == "1", body
        assert "Exceeds maximum KV-cache usage" in body and "MAX_KV_CACHE_USAGE 1e-06" in body, body
        conn.close()  # the long request is aborted; with nothing running the model takes requests again
        assert_aborted(srv, before)
        assert post(srv, "generate", {"text_input": "hello world", "sampling_parameters": sampling("")})[0] == 200
    finally:
        client.load_model(MODEL, config=json.dumps(config))
        client.close()


def test_the_engine_yields_the_cpu_to_the_server_on_a_small_host(served: tuple[Server, Any]) -> None:
    """ENGINE_NICE "auto": on a host with few cores the engine's busy-polling processes run at a
    lower priority than the worker that admits requests and hands out tokens; elsewhere, level."""
    srv, _ = served
    (worker,) = pids_of(srv, "worker")
    engine = [pid for pid, argv in children(worker).items() if argv and argv[0].startswith("VLLM::")]
    assert engine, children(worker)
    small = len(os.sched_getaffinity(0)) < priority.AUTO_MIN_CORES
    for pid in engine:
        lower = os.getpriority(os.PRIO_PROCESS, pid) - os.getpriority(os.PRIO_PROCESS, worker)
        assert lower == (priority.AUTO_NICE if small else 0), (pid, lower)


def test_the_worker_keeps_off_the_cores_the_cpu_engine_computes_on(served: tuple[Server, Any]) -> None:
    """vLLM's CPU build binds its model workers' compute threads to some cores and leaves the rest to
    the server: every thread of Conveyor's worker (its main, I/O, engine-loop and instance threads)
    keeps to the rest, so the frontend's work per token never preempts the model's."""
    srv, _ = served
    (worker,) = pids_of(srv, "worker")
    cores = bound_cpus(priority.descendants(worker))
    if not cores or cores == os.sched_getaffinity(0):
        pytest.skip(f"the engine bound no cores of its own here ({sorted(cores)})")
    threads = {int(t): os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{worker}/task")}
    assert all(cpus and not cpus & cores for cpus in threads.values()), (sorted(cores), threads)


def test_the_engine_core_runs_beside_its_model_on_a_small_host(served: tuple[Server, Any]) -> None:
    """ENGINE_CPUS "auto": on a small host the engine core process (left free by vLLM) keeps to the
    cores its model computes on, leaving the others to the server and its clients; elsewhere free."""
    srv, _ = served
    (worker,) = pids_of(srv, "worker")
    engine = priority.descendants(worker)
    cores = bound_cpus(engine)
    if not cores or cores == os.sched_getaffinity(0):
        pytest.skip(f"the engine bound no cores of its own here ({sorted(cores)})")
    # One engine core process per engine (the session's group runs two: vllm_model's and vllm_embed's).
    engine_cores = [pid for pid, argv in children(worker).items() if argv and argv[0].startswith("VLLM::EngineCore")]
    assert engine_cores, children(worker)
    threads = [os.sched_getaffinity(int(t)) for pid in engine_cores for t in os.listdir(f"/proc/{pid}/task")]
    small = len(os.sched_getaffinity(0)) < priority.AUTO_MIN_CORES
    assert all((cpus <= cores) is small for cpus in threads), (sorted(cores), threads)


def _exec_image(pid: int) -> bytes:
    """The auxiliary vector the kernel gave ``pid``'s program when it was exec'd (ASLR's addresses in it): a
    forked process has its parent's, a spawned one (a new interpreter) its own."""
    with open(f"/proc/{pid}/auxv", "rb") as f:
        return f.read()


def test_each_cpu_engine_core_spawns_its_model_worker_bound_to_its_cores(served: tuple[Server, Any]) -> None:
    """The worker spawns each engine core (its own threads and sockets must not be copied into it); a CPU
    engine core spawns its model worker too, as vLLM's server does, so that vLLM binds the worker's compute
    threads to their cores (a forked one was left unbound: model_workers.py, less than half the tokens/s)."""
    with open("/proc/sys/kernel/randomize_va_space") as f:
        if f.read().strip() == "0":
            pytest.skip("no ASLR here: a spawned process's auxiliary vector may equal its parent's")
    srv, _ = served
    (worker,) = pids_of(srv, "worker")
    engine_cores = [pid for pid, argv in children(worker).items() if argv and argv[0].startswith("VLLM::EngineCore")]
    assert len(engine_cores) == 2, children(worker)  # vllm_model's and vllm_embed's
    for core in engine_cores:
        assert _exec_image(core) != _exec_image(worker)  # spawned
        models = [pid for pid, argv in children(core).items() if argv and argv[0].startswith("VLLM::Worker")]
        assert models, children(core)
        assert all(_exec_image(pid) != _exec_image(core) for pid in models)  # spawned
        if len(os.sched_getaffinity(0)) > 1:  # vLLM keeps a core for the server: its compute threads are bound
            assert all(os.sched_getaffinity(pid) < os.sched_getaffinity(0) for pid in models)


def test_a_dead_engine_fails_requests_and_unloads_the_model(served: tuple[Server, Any],
                                                            served_llm: VllmGroup) -> None:
    """ENABLE_VLLM_HEALTH_CHECK, as Triton's L0_check_health_vllm: the engine core process killed mid-stream,
    the stream fails as UNAVAILABLE in Triton's words, the model unloads (at once: the engine core's end is
    seen as it happens, not at the next request), and later requests are to an unknown model. (Last in this
    module: the engines stay dead, the session's group is spent.)"""
    srv, _ = served
    spend(served_llm)
    # The pooling model's engine goes first: the one left in the worker is the model's under test.
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.unload_model(EMBED_MODEL)
    eventually(lambda: not client.is_model_ready(EMBED_MODEL), 60, what=f"{EMBED_MODEL} unloaded")
    assert grpc_stream(srv, {"ok": grpc_inputs("hello world", sampling(""), True)})["ok"][-1] is not None
    (worker,) = pids_of(srv, "worker")
    cores = [pid for pid, argv in children(worker).items() if argv and argv[0].startswith("VLLM::EngineCore")]
    assert cores, children(worker)
    segments = mapped_shm(cores, "psm_")  # vLLM's shared-memory queues, which it leaves behind
    assert segments
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    killed: list[int] = []

    def on_response(result: Any, error: Any) -> None:  # the first kills the engine: the stream is mid-way
        if not killed:
            for pid in cores:
                with contextlib.suppress(ProcessLookupError):  # the pooling model's, if it has not quite gone
                    os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        got.put((result, error))

    stream = grpcclient.InferenceServerClient(srv.grpc_url)
    stream.start_stream(callback=on_response)
    try:
        stream.async_stream_infer(MODEL, grpc_inputs("the quick brown", sampling("", max_tokens=200, ignore_eos=True),
                                                      True), request_id="dead")
        while True:
            _, error = got.get(timeout=60)
            if error is not None:
                break
    finally:
        stream.stop_stream()
        stream.close()
    assert error.message() == "Model is unavailable due to unhealthy vLLM engine"  # in-band: no status
    eventually(lambda: not client.is_model_ready(MODEL), 30, what="the unhealthy model unloaded")
    index = {m.name: m.state for m in client.get_model_repository_index().models}
    assert index[MODEL] == "UNAVAILABLE"
    # Unlinked as the engine closes, which the worker does after it has told the router the model is gone.
    eventually(lambda: not [name for name in segments if os.path.exists(f"/dev/shm/{name}")], 30,
               what="the dead engine's shared memory unlinked")
    with pytest.raises(InferenceServerException) as unknown:
        client.infer(MODEL, grpc_inputs("hello world", sampling(""), False))
    assert "has no available versions" in unknown.value.message()
    assert pids_of(srv, "worker") == {worker}  # the health check unloads the model: its worker stays
