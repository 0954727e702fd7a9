"""OpenAI's Responses API (ingress/openai/responses.py) with the official ``openai`` client, against a running
group of two OpenAI ingress processes with API keys, serving a Python model of the text contract that answers
its prompt's words reversed (tests/support/text_models.py), so that each answer shows the prompt the model
received: the instructions, the input, the stored conversation a follow-up continues, a tool's output.

Stored responses live in the group's store, which every ingress process opens: a follow-up is answered
through another ingress process than its first request's, and after every ingress process was killed and
restarted. The real engine (the tiny Llama, its template, forced calls, structured outputs):
test_openai_responses_vllm_e2e.py."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from conveyor.deploy.ports import free_port
from tests.support import text_models
from tests.support.group import Server, _listening, pids_of, start_server

LEVEL = "e2e"

MODEL = text_models.STREAMING  # a tokenizer and its chat template: "<|role|> content ... <|assistant|>"
KEY = "sk-responses-test"
INGRESS = "ingress-openai"
TRIES = 32  # new connections until one lands on the other ingress process (each a coin toss: 2**-32 to fail)
CALL = '<tool_call>{"name":"get_weather","arguments":{"city":"oslo"}}</tool_call>'  # one word: reversed, itself
WEATHER: Any = {"type": "function", "name": "get_weather", "description": "the weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int]]:
    repo = str(tmp_path_factory.mktemp("responses_models"))
    text_models.build(repo)
    port = free_port()
    srv = start_server(repo, f"rs{os.getpid()}", "--workers", "1", "--openai-port", str(port),
                       "--openai-address", "127.0.0.1", "--openai-ingress", "2", "--api-key", KEY,
                       "--tool-call-parser", "hermes", grpc=False)
    _wait_listening(srv, port)
    yield srv, port
    assert srv.stop() == 0
    assert srv.shm_segments() == []


def _wait_listening(srv: Server, port: int, old: set[int] | None = None) -> None:
    deadline = time.monotonic() + 60
    while not (_listening(port) and len(pids_of(srv, INGRESS) - (old or set())) == 2):
        assert time.monotonic() < deadline, "the OpenAI ingress processes did not listen"
        time.sleep(0.1)


def _client(port: int, key: str = KEY) -> Any:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def client(group: tuple[Server, int]) -> Any:
    """The client, untyped: its typed arguments and answers are unions of every kind of item and tool."""
    return _client(group[1])


def _tcp() -> list[tuple[int, int, int]]:
    """This host's established IPv4 TCP connections: (local port, remote port, socket inode)."""
    out = []
    with open("/proc/net/tcp", encoding="ascii") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[3] == "01":  # ESTABLISHED
                out.append((int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16), int(fields[9])))
    return out


def _sockets(pid: int) -> set[int]:
    """The socket inodes process ``pid`` holds."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[len("socket:["):-1]))
    return out


def _my_ports(port: int) -> set[int]:
    """This process's client ports of its connections to ``port``."""
    mine = _sockets(os.getpid())
    return {local for local, remote, inode in _tcp() if remote == port and inode in mine}


def _server_of(srv: Server, port: int, client_port: int) -> int:
    """The ingress process holding the server side of the connection from ``client_port``."""
    (inode,) = [inode for local, remote, inode in _tcp() if local == port and remote == client_port]
    for pid in pids_of(srv, INGRESS):
        if inode in _sockets(pid):
            return pid
    raise AssertionError(f"no ingress process holds the connection from port {client_port}")


def _served(srv: Server, port: int, call: Any) -> tuple[Any, int, Any]:
    """``call(client)`` on a new client: its answer, the ingress process that served it and the client, whose
    connection stays open (the next call on it goes to the same process)."""
    before = _my_ports(port)
    fresh = _client(port)
    out = call(fresh)
    (mine,) = _my_ports(port) - before
    return out, _server_of(srv, port, mine), fresh


def test_a_response_is_the_models_answer_to_instructions_and_input(client: Any) -> None:
    out = client.responses.create(model=MODEL, input="hello world", instructions="hi there", max_output_tokens=16,
                                  metadata={"k": "v"})
    # The template's prompt: "<|system|> hi there <|user|> hello world <|assistant|>", answered reversed.
    assert out.output_text == "<|assistant|> world hello <|user|> there hi <|system|>"
    assert out.id.startswith("resp_") and out.object == "response" and out.status == "completed"
    assert out.model == MODEL and out.instructions == "hi there" and out.max_output_tokens == 16
    assert out.store is True and out.metadata == {"k": "v"} and out.previous_response_id is None
    (item,) = out.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert out.usage is not None and out.usage.output_tokens == 7 and out.usage.input_tokens > 0
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    assert client.responses.retrieve(out.id).output_text == out.output_text  # stored (store defaults to true)
    cut = client.responses.create(model=MODEL, input="hello world", max_output_tokens=2)
    assert cut.output_text == "<|assistant|> world"  # (this model says no finish reason: the vLLM module's test)


def test_input_items_are_the_conversation(client: Any) -> None:
    items: Any = [{"role": "developer", "content": "hi"},
                  {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "there"}]},
                  {"role": "user", "content": "world"}]
    out = client.responses.create(model=MODEL, input=items, max_output_tokens=16)
    assert out.output_text == "<|assistant|> world <|user|> there <|assistant|> hello <|user|> hi <|system|>"


def test_a_stream_is_openais_events_of_the_same_answer(client: Any) -> None:
    with client.responses.stream(model=MODEL, input="hello world", max_output_tokens=16) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1  # a word or a few per step of the decoupled model, as they come
    assert kinds[4:] == ["response.output_text.delta"] * len(deltas) + [
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(deltas) == final.output_text == "<|assistant|> world hello <|user|>"
    assert final.status == "completed" and final.usage is not None and final.usage.output_tokens == 4  # a word a token
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_a_function_call_and_its_output_round_trip(client: Any) -> None:
    out = client.responses.create(model=MODEL, input=CALL, tools=[WEATHER], max_output_tokens=16)
    calls = [item for item in out.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].arguments == '{"city":"oslo"}'
    assert calls[0].call_id.startswith("call_") and out.tools[0].name == "get_weather"
    # The call's output, after the stored conversation: the model's prompt ends with it.
    follow = client.responses.create(model=MODEL, previous_response_id=out.id, tools=[WEATHER], max_output_tokens=3,
                                     input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                             "output": "sunny"}])
    assert follow.output_text == "<|assistant|> sunny <|tool|>" and follow.previous_response_id == out.id
    streamed = [e for e in client.responses.create(model=MODEL, input=CALL, tools=[WEATHER], max_output_tokens=16,
                                                   stream=True)]
    added = [e.item for e in streamed if e.type == "response.output_item.added"]
    assert [i.type for i in added][-1] == "function_call" and added[-1].name == "get_weather"
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == '{"city":"oslo"}'


def test_a_follow_up_continues_through_another_ingress_process_and_after_restarts(
        group: tuple[Server, int]) -> None:
    srv, port = group
    first, served, opened = _served(srv, port, lambda c: c.responses.create(
        model=MODEL, input="hello", instructions="hi", max_output_tokens=16))
    opened.close()
    assert first.output_text == "<|assistant|> hello <|user|> hi <|system|>"
    for _ in range(TRIES):  # a new connection until the kernel hands one to the other process
        seen, other, fresh = _served(srv, port, lambda c: c.responses.retrieve(first.id))
        if other != served:
            break
        fresh.close()
    assert other != served, "every connection went to the first request's ingress process"
    assert seen.output_text == first.output_text
    # The other process continues the stored conversation (its instructions do not carry over: OpenAI's).
    follow = fresh.responses.create(model=MODEL, previous_response_id=first.id, input="world", max_output_tokens=16)
    # "<|user|> hello <|assistant|> <first answer> <|user|> world <|assistant|>", reversed
    assert follow.output_text == ("<|assistant|> world <|user|> <|system|> hi <|user|> hello <|assistant|> "
                                  "<|assistant|> hello <|user|>")
    fresh.close()
    # Every ingress process killed: the supervisor starts new ones, which find the conversation on disk.
    old = pids_of(srv, INGRESS)
    for pid in old:
        os.kill(pid, signal.SIGKILL)
    _wait_listening(srv, port, old)
    client = _client(port)
    after = client.responses.create(model=MODEL, previous_response_id=follow.id, input="there", max_output_tokens=16)
    # "... <|user|> world <|assistant|> <second answer> <|user|> there <|assistant|>", reversed
    assert after.output_text.startswith("<|assistant|> there <|user|> <|user|> hello <|assistant|>")
    assert client.responses.retrieve(first.id).output_text == first.output_text


def test_stored_responses_are_retrieved_deleted_and_unknown_ids_are_404(client: Any) -> None:
    out = client.responses.create(model=MODEL, input="hello", max_output_tokens=4)
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
        client.responses.cancel(out.id)
    client.responses.delete(out.id)
    for call in (lambda: client.responses.retrieve(out.id), lambda: client.responses.delete(out.id),
                 lambda: client.responses.cancel(out.id),
                 lambda: client.responses.create(model=MODEL, input="x", previous_response_id=out.id)):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.status_code == 404
        body: Any = err.value.body
        assert body["message"] == f"Response with id '{out.id}' not found."
        assert body["type"] == "invalid_request_error"
    unstored = client.responses.create(model=MODEL, input="hello", max_output_tokens=4, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_a_wrong_or_missing_key_is_401_on_every_responses_route(group: tuple[Server, int],
                                                                client: Any) -> None:
    out = client.responses.create(model=MODEL, input="hello", max_output_tokens=4)
    wrong = _client(group[1], "wrong")
    for call in (lambda c: c.responses.create(model=MODEL, input="hello", max_output_tokens=4),
                 lambda c: c.responses.retrieve(out.id), lambda c: c.responses.delete(out.id),
                 lambda c: c.responses.cancel(out.id)):
        with pytest.raises(openai.AuthenticationError) as err:
            call(wrong)
        assert err.value.status_code == 401
    for method, path in (("POST", "/v1/responses"), ("GET", f"/v1/responses/{out.id}"),
                         ("DELETE", f"/v1/responses/{out.id}"), ("POST", f"/v1/responses/{out.id}/cancel")):
        conn = http.client.HTTPConnection("127.0.0.1", group[1], timeout=30)
        conn.request(method, path, body=b'{"model": "x", "input": "hello"}' if method == "POST" else None)
        answer = conn.getresponse()
        assert answer.status == 401, (method, path)
        assert json.loads(answer.read())["error"]["code"] == "invalid_api_key"
        conn.close()
    assert client.responses.retrieve(out.id).id == out.id  # nothing a refused request did
