"""``--api-key`` on a real group: the official ``openai`` client without a key, with a wrong one and with each
of the keys, and the ``anthropic`` client with its ``x-api-key``; the keys given on serve's command line reach
the OpenAI ingress in its environment, never on its command line (which every user of the host can read), and
appear in no log line."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from conveyor.deploy.ports import free_ports
from tests.support import openai_models
from tests.support.group import Server, _listening, roles, start_server

LEVEL = "e2e"

MODEL = "fake_llm"
KEYS = ("k-first-7c1d", "k-second-93ab")


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int, Path]]:
    repo = str(tmp_path_factory.mktemp("keys"))
    openai_models.build(repo, MODEL)
    (port,) = free_ports(1)
    log = tmp_path_factory.mktemp("log") / "serve.log"
    srv = start_server(repo, f"keys{os.getpid()}", "--workers", "1", "--openai-port", str(port),
                       "--openai-address", "127.0.0.1", "--api-key", *KEYS, "--log-file", str(log),
                       "--log-verbose", "1")
    try:
        deadline = time.monotonic() + 30
        while not _listening(port):
            assert time.monotonic() < deadline, "the OpenAI ingress did not listen"
            time.sleep(0.1)
        yield srv, port, log
    finally:
        assert srv.stop() == 0


def client(port: int, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=30)


def test_only_a_key_opens_the_models(keyed: tuple[Server, int, Path]) -> None:
    _, port, _ = keyed
    bare = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models")  # no Authorization at all
    with pytest.raises(urllib.error.HTTPError) as refused_bare:
        urllib.request.urlopen(bare, timeout=30)
    assert refused_bare.value.code == 401
    assert json.loads(refused_bare.value.read())["error"]["code"] == "invalid_api_key"
    for key in ("wrong", KEYS[0][:-1], KEYS[0] + "x"):
        with pytest.raises(openai.AuthenticationError) as refused:
            client(port, key).completions.create(model=MODEL, prompt="a b", max_tokens=2)
        assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            client(port, key).models.list()
    for key in KEYS:
        assert client(port, key).completions.create(model=MODEL, prompt="a b", max_tokens=2).choices[0].text
        assert [m.id for m in client(port, key).models.list()] == [MODEL]


def test_the_anthropic_client_sends_its_key_as_x_api_key(keyed: tuple[Server, int, Path]) -> None:
    """Anthropic's routes take the key where its clients put it (``x-api-key``) and refuse in its form."""
    _, port, _ = keyed

    def messages(key: str) -> Any:  # untyped: its typed arguments name Anthropic's own models
        return anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key=key, max_retries=0,
                                   timeout=30).messages

    for key in ("wrong", KEYS[0][:-1]):
        with pytest.raises(anthropic.AuthenticationError) as refused:
            messages(key).create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "a b"}])
        assert isinstance(refused.value.body, dict) and refused.value.body["error"]["type"] == "authentication_error"
    for key in KEYS:
        out = messages(key).create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "a b"}])
        assert out.content[0].text and out.stop_reason == "max_tokens"
        assert messages(key).count_tokens(model=MODEL, messages=[{"role": "user", "content": "a b"}]).input_tokens


def test_the_keys_travel_in_the_environment_and_are_never_logged(keyed: tuple[Server, int, Path]) -> None:
    server, port, log = keyed
    with pytest.raises(openai.AuthenticationError):
        client(port, "wrong-key-xyz").models.list()
    children = roles(server)
    ingress = [pid for pid, role in children.items() if role == "ingress-openai"]
    assert ingress, children
    for pid, role in children.items():  # the supervisor's is the user's own command line
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert b"--api-key" not in cmdline and not any(key.encode() in cmdline for key in KEYS), role
    for pid in ingress:
        assert f"CONVEYOR_API_KEYS={KEYS[0]}\n{KEYS[1]}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
    text = log.read_text()
    assert not any(key in text for key in (*KEYS, "wrong-key-xyz"))
