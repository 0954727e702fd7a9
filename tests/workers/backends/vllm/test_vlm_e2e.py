"""Images into a vision-language model (tests/support/tiny_vlm.py, a tiny BLIP-2) on both of Triton's LLM paths:
the OpenAI chat route's ``image_url`` parts (a ``data:`` URL, a ``file:`` URL under --allowed-local-media-path)
and the vLLM backend's ``image`` input (base64, as Triton's vllm_backend takes it) on ``generate``,
``generate_stream`` and plain infer. Greedy, each answer is vLLM's own ``LLM.chat`` / ``LLM.generate`` answer for
the same prompt and image; every bad input is a 400 in the route's own error form, and the engine serves the next
request. One engine, a few short generations: the limits themselves are tested without one
(test_media.py, tests/ingress/openai/test_openai_media.py)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import tritonclient.http as httpclient

from conveyor.deploy.ports import free_port
from tests.support import tiny_llama, tiny_vlm
from tests.support.group import Server, start_server

LEVEL = "e2e"

tiny_llama.require_vllm()
# The module's fixture builds the model (some 60 Adam steps), runs vLLM's own engine, then the group's: on a busy
# 2-core host each takes minutes.
pytestmark = pytest.mark.timeout(900)

MODEL = "vlm_model"
READY_TIMEOUT_S = 300.0  # a vLLM engine on a busy 2-core host: 30-120 s to import and start


@dataclass
class Served:
    server: Server
    client: openai.OpenAI
    ref: dict[str, str]  # vLLM's own answers (tiny_vlm.reference)
    media: Path  # the folder file: URLs may name


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    model_dir = tiny_vlm.build(tmp_path_factory.getbasetemp() / "tiny_vlm")
    repo = tmp_path_factory.mktemp("vlm_repo")
    tiny_vlm.write_repository(repo, model_dir, MODEL)
    media = tmp_path_factory.mktemp("media")
    (media / "one.png").write_bytes(tiny_vlm.image_png(1))
    ref = tiny_vlm.reference(model_dir)  # before the group: one engine at a time on this host
    openai_port = free_port()
    # One worker, for the model's one engine: a second would only cost the start its process.
    server = start_server(str(repo), f"vlm{openai_port}", "--workers", "1", "--openai-port", str(openai_port),
                          "--openai-address", "127.0.0.1", "--allowed-local-media-path", str(media),
                          ready_timeout=READY_TIMEOUT_S)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{openai_port}/v1", api_key="none", max_retries=0, timeout=120)
    try:
        yield Served(server, client, ref, media)
    finally:
        client.close()
        assert server.stop(60) == 0


def test_vllm_answers_differ_by_image(served: Served) -> None:
    """The check the comparisons stand on: the image reaches the model and moves its answer."""
    assert served.ref["generate:1"] != served.ref["generate:2"]


def _chat(served: Served, url: str, stream: bool = False) -> str:
    messages: Any = tiny_vlm.chat_messages(url)
    if not stream:
        answer = served.client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                                       max_tokens=tiny_vlm.MAX_TOKENS)
        return answer.choices[0].message.content or ""
    chunks = served.client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                                   max_tokens=tiny_vlm.MAX_TOKENS, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_an_image_url_reaches_the_model_with_vllms_answer(served: Served) -> None:
    for seed in tiny_vlm.IMAGE_SEEDS:
        assert _chat(served, tiny_vlm.data_url(seed)) == served.ref[f"chat:{seed}"]
    assert _chat(served, tiny_vlm.data_url(1), stream=True) == served.ref["chat:1"]
    assert _chat(served, f"file://{served.media}/one.png") == served.ref["chat:1"]  # the same image, read here


def _b64(seed: int) -> str:
    return base64.b64encode(tiny_vlm.image_png(seed)).decode()


def _generate(served: Served, route: str, images: list[str], prompt: str = tiny_vlm.PROMPT) -> tuple[int, Any]:
    import http.client

    body = {"text_input": prompt, "image": images, "exclude_input_in_output": True,
            "sampling_parameters": json.dumps({"temperature": 0, "max_tokens": tiny_vlm.MAX_TOKENS})}
    conn = http.client.HTTPConnection("127.0.0.1", served.server.http_port, timeout=120)
    try:
        conn.request("POST", f"/v2/models/{MODEL}/{route}", body=json.dumps(body))
        r = conn.getresponse()
        raw = r.read()
    finally:
        conn.close()
    if r.status != 200:
        return r.status, json.loads(raw)
    if route == "generate":
        return 200, json.loads(raw)["text_output"]
    events = [json.loads(line[len(b"data: "):]) for line in raw.splitlines() if line.startswith(b"data: ")]
    return 200, "".join(e.get("text_output", "") for e in events)


def test_the_image_input_reaches_the_model_with_vllms_answer(served: Served) -> None:
    for seed in tiny_vlm.IMAGE_SEEDS:
        assert _generate(served, "generate", [_b64(seed)]) == (200, served.ref[f"generate:{seed}"])
    assert _generate(served, "generate_stream", [_b64(1)]) == (200, served.ref["generate:1"])
    # KServe infer (plain: the decoupled model's one final response), as tritonclient sends it.
    client = httpclient.InferenceServerClient(f"127.0.0.1:{served.server.http_port}")
    try:
        inputs = []
        for name, dtype, value in (("text_input", "BYTES", tiny_vlm.PROMPT.encode()), ("image", "BYTES", _b64(1)),
                                   ("exclude_input_in_output", "BOOL", True),
                                   ("sampling_parameters", "BYTES", json.dumps({"temperature": 0,
                                                                                "max_tokens": tiny_vlm.MAX_TOKENS}))):
            t = httpclient.InferInput(name, [1], dtype)
            t.set_data_from_numpy(np.array([value], dtype=object if dtype == "BYTES" else bool))
            inputs.append(t)
        out = client.infer(MODEL, inputs).as_numpy("text_output")
        assert out is not None and out[0].decode() == served.ref["generate:1"]
    finally:
        client.close()


def test_bad_images_are_400s_and_the_engine_serves_the_next_request(served: Served) -> None:
    bad_png = base64.b64encode(b"\x89PNG\r\n\x1a\n not really").decode()
    for url, why in [
        ("data:image/png;base64," + bad_png, "is not an image"),
        ("http://127.0.0.1:9/one.png", "fetches no remote media"),  # fetching is off: nothing is fetched
        (f"file://{served.media}/../secret.png", "not under the folder"),
    ]:
        with pytest.raises(openai.BadRequestError) as err:
            _chat(served, url)
        assert err.value.status_code == 400 and why in err.value.message
        body = err.value.body
        assert isinstance(body, dict) and body.get("type") == "invalid_request_error"  # OpenAI's error form
    two: Any = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": tiny_vlm.data_url(1)}},
                                             {"type": "image_url", "image_url": {"url": tiny_vlm.data_url(2)}},
                                             {"type": "text", "text": tiny_vlm.PROMPT}]}]
    with pytest.raises(openai.BadRequestError, match="At most 1 image"):  # the engine's limit_mm_per_prompt
        served.client.chat.completions.create(model=MODEL, messages=two, max_tokens=2)
    for images, why in [(["not base64!"], "not valid base64"), ([bad_png], "is not an image"),
                        ([_b64(1), _b64(2)], "At most 1 image")]:
        for route in ("generate", "generate_stream"):
            status, doc = _generate(served, route, images)
            assert status == 400 and why in doc["error"], (route, images, doc)  # Triton's generate error form
    assert _generate(served, "generate", [_b64(2)]) == (200, served.ref["generate:2"])
    assert _chat(served, tiny_vlm.data_url(2)) == served.ref["chat:2"]
