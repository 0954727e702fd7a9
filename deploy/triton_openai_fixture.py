"""Stands in for python/openai/tests/utils.py of triton-inference-server/server when its OpenAI frontend
tests run against Conveyor (deploy/triton_qa_openai.sh copies it over utils.py; the test files are unchanged).

What changes is the program the fixture starts: ``conveyor openai-frontend`` with the same flags, in place of
``python3 openai_frontend/main.py`` ($CONVEYOR_OPENAI_FRONTEND, a command line). Triton's in-process
fixtures become the same group behind an ASGI app: ``setup_server`` remembers the repository and its model
control, ``setup_fastapi_app`` returns an app whose lifespan starts the group (with main.py's flags for the
tokenizer, backend, tool-call parser and default max tokens) on a free port and that passes every request
to it over HTTP, so FastAPI's ``TestClient`` talks to Conveyor's real OpenAI endpoint.
"""
from __future__ import annotations

import asyncio
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx
import openai
import requests

# As Triton's utils.py: its test files then import openai_frontend's own classes (the request-size and
# API-restriction middleware) by their package names, for the few tests of those classes themselves.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "openai_frontend"))
import tritonserver  # type: ignore[import-not-found]  # Triton's test files import it (a stand-in)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


def _program() -> list[str]:
    return shlex.split(os.environ.get("CONVEYOR_OPENAI_FRONTEND", "conveyor openai-frontend"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Repository:
    """What ``setup_server`` stood for: a repository and how its models are loaded (Triton's Server)."""

    def __init__(self, model_repository: str, model_control_mode: Any, load_models: list[str] | None) -> None:
        self.args = ["--model-repository", model_repository]
        if model_control_mode == tritonserver.ModelControlMode.EXPLICIT:
            self.args += ["--model-control-mode", "explicit"]
            for name in load_models or []:
                self.args += ["--load-model", name]

    def stop(self) -> None:
        """Each app stops the group it started."""


def setup_server(model_repository: str, model_control_mode: Any = tritonserver.ModelControlMode.NONE,
                 load_models: list[str] | None = None) -> Any:
    return _Repository(model_repository, model_control_mode, load_models)


def setup_fastapi_app(tokenizer: str, server: Any, backend: str | None, default_max_tokens: int = 16,
                      tool_call_parser: str | None = None, max_tool_call_parse_bytes: int | None = None) -> Any:
    args = [*server.args, "--default-max-tokens", str(default_max_tokens)]
    for flag, value in (("--tokenizer", tokenizer), ("--backend", backend), ("--tool-call-parser", tool_call_parser),
                        ("--max-tool-call-parse-bytes", max_tool_call_parse_bytes)):
        if value:
            args += [flag, str(value)]
    return _GroupApp(args)


class _GroupApp:
    """An ASGI app: its lifespan runs the group, each request goes to the group's OpenAI port."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.server: OpenAIServer | None = None

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    port = _free_port()
                    self.server = await asyncio.to_thread(OpenAIServer, [*self.args, "--openai-port", str(port)])
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if self.server is not None:
                        await asyncio.to_thread(self.server.__exit__, None, None, None)
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        assert self.server is not None, "the app's lifespan starts the group: use it inside TestClient's with"
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        query = scope.get("query_string", b"").decode()
        url = self.server.url_root + scope["path"] + (f"?{query}" if query else "")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"host", b"transfer-encoding")]
        async with httpx.AsyncClient(timeout=None) as client:
            request = client.build_request(scope["method"], url, headers=headers, content=body)
            response = await client.send(request, stream=True)
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k, v) for k, v in response.headers.raw if k.lower() != b"transfer-encoding"]})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


class OpenAIServer:
    """Triton's fixture class, starting Conveyor's command (its --openai-port, default 9000, is honoured)."""

    API_KEY = "EMPTY"
    START_TIMEOUT = float(os.environ.get("CONVEYOR_OPENAI_START_TIMEOUT", "240"))

    def __init__(self, cli_args: list[str], *, env_dict: dict[str, str] | None = None) -> None:
        self.host = "localhost"
        self.port = 9000
        if "--openai-port" in cli_args:
            self.port = int(cli_args[cli_args.index("--openai-port") + 1])
        env = os.environ.copy()
        if env_dict is not None:
            env.update(env_dict)
        self.proc = subprocess.Popen([*_program(), *[str(a) for a in cli_args]], env=env, stdout=sys.stdout,
                                     stderr=subprocess.PIPE, text=True)
        self.stderr_lines: list[str] = []
        threading.Thread(target=self._read_stderr, daemon=True).start()
        try:
            self._wait_for_server(url=self.url_for("health", "ready"), timeout=self.START_TIMEOUT)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def _read_stderr(self) -> None:
        try:
            if self.proc.stderr:
                for line in iter(self.proc.stderr.readline, ""):
                    self.stderr_lines.append(line.rstrip("\n\r"))
                    sys.stderr.write(line)
                    sys.stderr.flush()
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"[OpenAIServer] Error while reading stderr: {exc}\n")

    def __enter__(self) -> OpenAIServer:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _wait_for_server(self, *, url: str, timeout: float) -> None:
        start = time.time()
        while True:
            try:
                if requests.get(url, timeout=5).status_code == 200:
                    return
            except Exception as err:
                result = self.proc.poll()
                if result is not None and result != 0:
                    time.sleep(0.2)  # the reader thread takes the last lines
                    text = "\n".join(self.stderr_lines) or "No stderr output"
                    raise RuntimeError(f"Server exited unexpectedly with return code {result}.\n"
                                       f"Stderr output:\n{text}") from err
                if time.time() - start > timeout:
                    text = "\n".join(self.stderr_lines) or "No stderr output"
                    raise RuntimeError(f"Server failed to start in time.\nStderr output:\n{text}") from err
            time.sleep(0.5)

    @property
    def url_root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        return self.url_root + "/" + "/".join(parts)

    def get_client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.API_KEY)

    def get_async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url_for("v1"), api_key=self.API_KEY)
