"""A chat request's images (``image_url`` content parts), as the OpenAI ingress reads them before anything is
sent (ingress/openai/media.py, schema.py): a ``data:`` URL's base64 as it is; a remote URL only when the
operator allows fetching, within a size and a time limit; a ``file:`` URL only under the allowed folder; each
refusal a 400. With the engine: tests/workers/backends/vllm/test_vlm_e2e.py."""

from __future__ import annotations

import asyncio
import base64
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from conveyor.ingress.openai.catalog import LlmModel, Target
from conveyor.ingress.openai.contract import Contract
from conveyor.ingress.openai.generation import engine_call
from conveyor.ingress.openai.media import NO_MEDIA_OPTIONS, MediaOptions, count, image_b64
from conveyor.ingress.openai.schema import ChatRequest, TokenizeRequest, chat_messages, decode
from conveyor.proto import llm_limits
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.signature import ModelSignature, TensorSpec

LEVEL = "unit"

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 32  # the ingress never decodes an image: any bytes stand for one
B64 = base64.b64encode(PNG)
DATA_URL = "data:image/png;base64," + B64.decode()


def _read(url: str, options: MediaOptions = NO_MEDIA_OPTIONS) -> bytes:
    return asyncio.run(image_b64(url, options))


def _refused(url: str, match: str, options: MediaOptions = NO_MEDIA_OPTIONS) -> None:
    with pytest.raises(ConveyorError, match=match) as err:
        _read(url, options)
    assert err.value.status == Status.INVALID_ARG


def _chat(content: Any) -> ChatRequest:
    return decode(msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": content}]}),
                  ChatRequest)


def test_image_parts_leave_the_text_and_their_urls_are_taken_in_order() -> None:
    urls: list[str] = []
    messages = chat_messages(_chat([{"type": "text", "text": "what is"}, {"type": "image_url",
                                    "image_url": {"url": "data:a"}}, {"type": "text", "text": "this?"},
                                    {"type": "image_url", "image_url": {"url": "data:b", "detail": "low"}}]), urls)
    assert messages == [{"role": "user", "content": "what is\nthis?"}]  # vLLM joins the text parts so
    assert urls == ["data:a", "data:b"]
    with pytest.raises(ConveyorError, match="content parts of type 'input_audio' are not supported"):
        chat_messages(_chat([{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]), [])
    # A route that sends no images (/tokenize) refuses them, as before.
    tokenize = decode(msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": DATA_URL}}]}]}), TokenizeRequest)
    with pytest.raises(ConveyorError, match="only text content parts are supported"):
        chat_messages(tokenize)


def test_images_per_request_are_bounded_before_any_is_read() -> None:
    count(["u"] * llm_limits.MAX_MEDIA_ITEMS)
    with pytest.raises(ConveyorError, match=f"at most {llm_limits.MAX_MEDIA_ITEMS} are taken"):
        count(["u"] * (llm_limits.MAX_MEDIA_ITEMS + 1))


def test_a_data_url_is_its_base64_as_it_is() -> None:
    assert _read(DATA_URL) == B64
    _refused("data:image/png,raw-bytes", "must be base64-encoded")
    _refused("data:image/png;base64," + "A" * (llm_limits.MAX_MEDIA_B64_CHARS + 4), "base64 characters; at most")
    _refused("ftp://example.com/a.png", "must be a `data:` URL")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP server of /small (PNG), /large (past MAX_MEDIA_BYTES, no Content-Length) and /slow
    (never answers); the paths it was asked for."""
    asked: list[str] = []
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            if self.path == "/slow":
                release.wait(30)
                return
            self.send_response(200)
            self.end_headers()
            if self.path == "/small":
                self.wfile.write(PNG)
            else:
                chunk = b"\0" * (1 << 20)
                try:
                    for _ in range(llm_limits.MAX_MEDIA_BYTES // len(chunk) + 2):
                        self.wfile.write(chunk)
                except OSError:  # the ingress stopped reading at its limit
                    pass

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    release.set()
    server.shutdown()
    server.server_close()


def test_remote_urls_are_fetched_only_when_allowed_within_size_and_time(served: tuple[str, list[str]]) -> None:
    base, asked = served
    _refused(f"{base}/small", "fetches no remote media")
    assert asked == []  # off by default: nothing was fetched
    allowed = MediaOptions(fetch_remote=True, fetch_timeout_s=60.0)
    assert _read(f"{base}/small", allowed) == B64
    _refused(f"{base}/large", f"larger than {llm_limits.MAX_MEDIA_BYTES} bytes", allowed)
    _refused(f"{base}/slow", "took more than 1 s", MediaOptions(fetch_remote=True, fetch_timeout_s=1.0))


def test_a_local_file_is_read_only_under_the_allowed_folder(tmp_path: Path) -> None:
    allowed = tmp_path / "media"
    allowed.mkdir()
    (allowed / "a.png").write_bytes(PNG)
    (tmp_path / "secret.png").write_bytes(PNG)
    (allowed / "link.png").symlink_to(tmp_path / "secret.png")
    os.mkfifo(allowed / "fifo.png")
    (allowed / "big.png").write_bytes(b"\0" * (llm_limits.MAX_MEDIA_BYTES + 1))
    options = MediaOptions(local_path=str(allowed))
    _refused(f"file://{allowed}/a.png", "reads no local files")  # no folder allowed: the default
    assert _read(f"file://{allowed}/a.png", options) == B64
    for outside in (f"file://{tmp_path}/secret.png", f"file://{allowed}/../secret.png", f"file://{allowed}/link.png"):
        _refused(outside, "not under the folder", options)
    _refused(f"file://{allowed}/fifo.png", "not a regular file", options)  # refused at once, never waited on
    _refused(f"file://{allowed}/missing.png", "cannot be read", options)
    _refused(f"file://{allowed}/big.png", "larger than", options)
    _refused(f"file://elsewhere{allowed}/a.png", "must name a local path", options)


def _target(inputs: dict[str, str]) -> Target:
    sig = ModelSignature("m", 0, {n: TensorSpec(n, dt, (-1,)) for n, dt in inputs.items()},
                         {"text_output": TensorSpec("text_output", "BYTES", (-1,))}, decoupled=True)
    return Target(LlmModel("m", sig, Contract(True, True, True), "/m", {}, 0), None)


def test_the_images_go_in_the_models_image_input_and_a_model_without_it_refuses() -> None:
    target = _target({"text_input": "BYTES", "sampling_parameters": "BYTES", "image": "BYTES"})
    call = engine_call(target, "what is this?", {"n": 1}, False, "", [B64, B64])
    (image,) = [i for i in call.inputs if i.name == "image"]
    assert (image.datatype, image.shape) == ("BYTES", [2])
    assert isinstance(image.data, np.ndarray) and image.data.tolist() == [B64, B64]
    assert "image" not in {i.name for i in engine_call(target, "hi", {"n": 1}, False).inputs}  # none: no input
    with pytest.raises(ConveyorError, match="model 'm' does not take images"):
        engine_call(_target({"text_input": "BYTES", "sampling_parameters": "BYTES"}), "a", {"n": 1}, False, "", [B64])
