"""``conveyor openai-frontend``: the command line of Triton's OpenAI-compatible frontend
(python/openai/openai_frontend/main.py), every flag of it, parsed as main.py parses it and run as the
group it stands for; the command line of Triton's own test fixture (python/openai/tests/conftest.py)
runs unchanged against a real group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from conveyor.deploy.cli import build_parser, build_tritonserver_parser
from conveyor.deploy.openai_frontend import (
    FRONTEND_FLAGS,
    HTTP_DEFAULT_MAX_INPUT_SIZE,
    build_frontend_parser,
    check,
    frontend_main,
    serve_argv,
)
from conveyor.deploy.ports import free_ports
from conveyor.deploy.settings import ServeSettings
from tests.support import openai_models, text_models
from tests.support.group import abandon

LEVEL = "e2e"

# Every flag of main.py's parse_args (triton-inference-server/server python/openai/openai_frontend/main.py,
# main at e1db8a6), in its order, with a value of its type. A flag Triton adds must be added here and to
# deploy/openai_frontend.py's FRONTEND_FLAGS.
MAIN_PY_FLAGS: list[tuple[str, list[str]]] = [
    ("--model-repository", ["/models"]), ("--tokenizer", ["meta-llama/Meta-Llama-3.1-8B-Instruct"]),
    ("--backend", ["vllm"]), ("--lora-separator", ["_lora_"]), ("--tritonserver-log-verbose-level", ["1"]),
    ("--host", ["127.0.0.1"]), ("--tool-call-parser", ["llama3"]), ("--max-tool-call-parse-bytes", ["4096"]),
    ("--chat-template", ["/tmp/template.jinja"]), ("--default-max-tokens", ["32"]),
    ("--model-control-mode", ["explicit"]), ("--load-model", ["llm"]),
    ("--openai-port", ["9100"]), ("--uvicorn-log-level", ["debug"]),
    ("--openai-restricted-api", ["inference,model-repository", "admin-key", "admin-value"]),
    ("--http-max-input-size", ["1048576"]),
    ("--enable-kserve-frontends", []), ("--kserve-http-port", ["9101"]), ("--kserve-grpc-port", ["9102"]),
]


def _command_line() -> list[str]:
    return [word for flag, values in MAIN_PY_FLAGS for word in (flag, *values)]


def _serve(argv: list[str]) -> tuple[ServeSettings, list[str]]:
    args = build_frontend_parser().parse_args(argv)
    serve, notes = serve_argv(args)
    parsed = build_tritonserver_parser().parse_args(serve)
    from conveyor.deploy.options import fold_http_max_input_size

    assert fold_http_max_input_size(parsed) == ""
    return ServeSettings.of(parsed), notes


def test_every_flag_of_main_py_is_taken_in_its_order() -> None:
    assert [f.flag for f in FRONTEND_FLAGS] == [flag for flag, _ in MAIN_PY_FLAGS]
    # The subcommand takes them too, as they are.
    args = build_parser().parse_args(["openai-frontend", *_command_line()])
    assert args.command == "openai-frontend" and args.openai_port == 9100


def test_each_flag_becomes_the_setting_that_does_the_same() -> None:
    settings, notes = _serve(_command_line())
    assert settings.model_repository == ["/models"]
    assert settings.tokenizer == "meta-llama/Meta-Llama-3.1-8B-Instruct"
    assert settings.lora_separator == "_lora_" and settings.default_max_tokens == 32
    assert settings.tool_call_parser == "llama3_json"  # Triton's name for vLLM's parser
    assert settings.log_verbose == 1
    assert (settings.openai_address, settings.http_address, settings.grpc_address) == ("127.0.0.1",) * 3
    assert settings.model_control_mode == "explicit" and settings.load_model == ["llm"]
    assert settings.openai_port == 9100
    assert (settings.allow_http, settings.allow_grpc, settings.http_port, settings.grpc_port) == (True, True, 9101,
                                                                                                  9102)
    assert settings.http_max_body_bytes == 1048576
    [group] = settings.openai_restricted_api
    assert "admin-key" in str(group) and "admin-value" in str(group)
    # main.py's process serves no metrics port of its own.
    assert settings.allow_metrics is False
    # Each flag with no work to do here is named once, with its reason.
    named = [note.split("=")[0] for note in notes]
    assert named == ["--backend", "--max-tool-call-parse-bytes",
                     "--chat-template", "--uvicorn-log-level"]
    assert all("accepted, not used by Conveyor because" in note for note in notes)


def test_main_py_defaults() -> None:
    settings, notes = _serve(["--model-repository", "/models"])
    assert notes == []
    assert settings.openai_error_form == "triton"  # Conveyor's own flag, defaulting to Triton's frontend's answers
    assert _serve(["--model-repository", "/models", "--openai-error-form", "openai"])[0].openai_error_form == "openai"
    assert settings.openai_port == 9000 and settings.default_max_tokens == 16
    assert (settings.allow_http, settings.allow_grpc, settings.allow_metrics) == (False, False, False)
    assert settings.http_max_body_bytes == HTTP_DEFAULT_MAX_INPUT_SIZE
    assert settings.openai_address == "0.0.0.0" and settings.model_control_mode == "none"


def test_main_py_refusals_in_its_words(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_frontend_parser().parse_args(["--model-repository", "/models", "--load-model", "llm"])
    assert check(args) == "Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
    with pytest.raises(SystemExit):
        build_frontend_parser().parse_args([])  # --model-repository is required
    with pytest.raises(SystemExit):
        build_frontend_parser().parse_args(["--model-repository", "/m", "--http-max-input-size", "0"])
    assert "value must be greater than 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a parser this server has not: refused at start, not at the first request
        build_tritonserver_parser().parse_args(["--model-repository", "/m", "--tool-call-parser", "llama2"])
    assert "'llama2' is not a tool-call parser: granite, hermes" in capsys.readouterr().err


def test_main_py_start_up_refusals_in_tritons_words(capsys: pytest.CaptureFixture[str]) -> None:
    """What Triton's in-process server refuses at its creation, before any process of the group starts."""
    args = build_frontend_parser().parse_args(["--model-repository", "/models", "--model-control-mode", "explicit",
                                               "--load-model", "*", "--load-model", "llm"])
    assert frontend_main(args, False) == 1
    assert capsys.readouterr().err == ("error: creating server: Invalid argument - Wildcard model name '*' must be "
                                       "the ONLY startup model if specified at all.\n")


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except Exception:
        return 0


def test_the_command_line_of_tritons_fixture_runs_a_group(tmp_path: object) -> None:
    """conftest.py's ``server`` fixture: main.py's flags, the KServe frontends on; its OpenAI client works."""
    repo = os.path.join(str(tmp_path), "models")
    openai_models.build(repo)
    text_models.build(repo)  # models whose configs name no tool-call parser; PLAIN names no tokenizer either
    # conftest.py's tokenizer is $TEST_TOKENIZER (a Hugging Face id by default; a folder here: no download)
    tokenizer = os.path.join(repo, text_models.STREAMING, "tokenizer")
    openai_port, http_port, grpc_port = free_ports(3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor.deploy.cli", "openai-frontend", "--model-repository", repo,
         "--tokenizer", tokenizer, "--backend", "vllm", "--tool-call-parser",
         "llama3", "--enable-kserve-frontends", "--host", "127.0.0.1", "--openai-port", str(openai_port),
         "--kserve-http-port", str(http_port), "--kserve-grpc-port", str(grpc_port)],
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _get(f"http://127.0.0.1:{openai_port}/health/ready") != 200:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{openai_port}/v1", api_key="EMPTY")
        cards = {card.id: card for card in client.models.list().data}
        assert cards["fake_llm"].owned_by == "Triton Inference Server"  # Triton's model card
        # Triton's frontend serves the server's metrics on the OpenAI port (no metrics port of its own).
        with urllib.request.urlopen(f"http://127.0.0.1:{openai_port}/metrics", timeout=10) as r:
            assert "nv_cpu_utilization" in r.read().decode()
        answer = client.completions.create(model="fake_llm", prompt="one two three", max_tokens=2)
        assert answer.choices[0].text == " one two"
        assert _get(f"http://127.0.0.1:{http_port}/v2/health/ready") == 200  # --enable-kserve-frontends
        # --tool-call-parser llama3: the parser of a model whose config names none ("auto" is refused without).
        tools: Any = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        hi: Any = [{"role": "user", "content": "hi"}]
        chat = client.chat.completions.create(model=text_models.STREAMING, messages=hi, tools=tools, max_tokens=2)
        assert chat.choices[0].message.tool_calls is None  # the model's text holds no call: an answer in text
        # --tokenizer: the tokenizer of a model that names none (PLAIN: without, /tokenize is a 400).
        body = json.dumps({"model": text_models.PLAIN, "prompt": "hello world"}).encode()
        tokenize = urllib.request.Request(f"http://127.0.0.1:{openai_port}/tokenize", method="POST", data=body,
                                          headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(tokenize, timeout=10) as r:
            assert json.loads(r.read())["tokens"] == [1, 5, 6]
        # Triton's frontend's model management needs explicit mode (this is main.py's default, none).
        refused = urllib.request.Request(f"http://127.0.0.1:{openai_port}/v1/models/fake_llm/unload", method="POST")
        with pytest.raises(urllib.error.HTTPError) as http_error:
            urllib.request.urlopen(refused, timeout=10)
        assert (http_error.value.code, json.loads(http_error.value.read())) == (
            400, {"detail": "Model load/unload requires --model-control-mode=explicit"})
        # Triton's frontend's error answers are the command's default (--openai-error-form triton).
        empty = urllib.request.Request(f"http://127.0.0.1:{openai_port}/v1/completions", method="POST", data=b"{}",
                                       headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as http_error:
            urllib.request.urlopen(empty, timeout=10)
        assert (http_error.value.code, json.loads(http_error.value.read())["detail"][0]["msg"]) == (
            422, "Field required")
    finally:
        abandon(proc)
    _, err = proc.communicate()
    assert "--backend=vllm: accepted, not used by Conveyor because" in err


def test_help_lists_main_py_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_frontend_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for group in ("Triton Inference Server", "Triton OpenAI-Compatible Frontend", "Triton KServe Frontend"):
        assert group in out
