"""``conveyor openai-frontend``: the command line of Triton's OpenAI-compatible frontend
(``python3 python/openai/openai_frontend/main.py``) as it is, running the same group as ``tritonserver``.

Triton's frontend is one Python process: an in-process Triton server, its OpenAI endpoint on
``--openai-port`` and, with ``--enable-kserve-frontends``, KServe HTTP and gRPC. Here each of its flags
becomes the ``tritonserver`` flags (deploy/settings.py) that do the same (``FRONTEND_FLAGS``); a flag with
no work to do in Conveyor's design is accepted and logged once at start with the reason, as
``tritonserver``'s unused flags are (deploy/triton_flags.py). ``tests/deploy/test_openai_frontend_cli.py``
keeps a copy of main.py's flag list and fails when the two disagree. Conveyor's own flags the command takes
besides (``EXTENSION_FLAGS``) default to what Triton's frontend does: its error answers
(``--openai-error-form triton``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conveyor.ingress.openai.forms import ERROR_FORMS, TRITON

# main.py's defaults (openai_frontend/utils/utils.py, engine/utils/tool_call_parsers/utils.py).
HTTP_DEFAULT_MAX_INPUT_SIZE = 1 << 26  # 64 MiB, as Triton's src/common.h
DEFAULT_MAX_TOOL_CALL_PARSE_BYTES = 128 * 1024
DEFAULT_OPENAI_PORT = 9000

_GROUP_TRITON = "Triton Inference Server"
_GROUP_OPENAI = "Triton OpenAI-Compatible Frontend"
_GROUP_KSERVE = "Triton KServe Frontend"
_GROUP_CONVEYOR = "Conveyor's own (not main.py's)"


def _positive_int(value: str) -> int:
    """main.py's ``validate_positive_int``."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"value is not an integer, got {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"value must be greater than 0, got {value!r}")
    return number


def _same(flag: str) -> Callable[[Any], list[str]]:
    """The tritonserver flag of the same meaning, given the value as it is (omitted when unset)."""
    def to_serve(value: Any) -> list[str]:
        return [] if value is None or value == "" else [flag, str(value)]
    return to_serve


def _load_models(value: list[str] | None) -> list[str]:
    return [arg for name in value or [] for arg in ("--load-model", name)]


def _restricted(value: list[list[str]] | None) -> list[str]:
    return [arg for words in value or [] for arg in ("--openai-restricted-api", *words)]


def _host(value: str) -> list[str]:
    # main.py's one address serves the OpenAI endpoint and both KServe frontends.
    return ["--openai-address", value, "--http-address", value, "--grpc-address", value]


def _kserve(value: bool) -> list[str]:
    on = "true" if value else "false"
    return ["--allow-http", on, "--allow-grpc", on]


@dataclass(frozen=True)
class FrontendFlag:
    """One flag of main.py: its argparse arguments, and what it becomes here."""

    flag: str
    group: str
    options: dict[str, Any]
    to_serve: Callable[[Any], list[str]] | None = None  # the tritonserver flags it stands for
    unused: str = ""  # why it changes nothing here (logged at start when given)
    dest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dest", self.flag.lstrip("-").replace("-", "_"))


_BACKEND = ("each model's request format is read from its config.pbtxt (its backend, inputs and outputs): "
            "vLLM and Python models are told apart without an override")
_CHAT_TEMPLATE = ("each model's chat template is its tokenizer's (chat_template.jinja or tokenizer_config.json "
                  "in its tokenizer folder): put the template there")
_PARSE_BYTES = ("a streamed answer's tool-call text is bounded by the request's max_tokens and the model's "
                "context; the parser keeps no growing buffer beyond the answer itself")
_UVICORN = ("the OpenAI endpoint is Conveyor's own ASGI server: its log level follows "
            "--tritonserver-log-verbose-level (debug when above 0)")

# main.py's flags, in its --help's order, with main.py's types, defaults and help.
FRONTEND_FLAGS: tuple[FrontendFlag, ...] = (
    FrontendFlag("--model-repository", _GROUP_TRITON, dict(
        type=str, required=True, help="Path to the Triton model repository holding the models to be served"),
        _same("--model-repository")),
    FrontendFlag("--tokenizer", _GROUP_TRITON, dict(
        type=str, default=None, help="HuggingFace ID or local folder path of the Tokenizer to use for chat "
        "templates"), _same("--tokenizer")),
    FrontendFlag("--backend", _GROUP_TRITON, dict(
        type=str, default=None, choices=["vllm", "tensorrtllm"],
        help="Manual override of Triton backend request format (inputs/output names) to use for inference"),
        unused=_BACKEND),
    FrontendFlag("--lora-separator", _GROUP_TRITON, dict(
        type=str, default=None, help="LoRA name selection may be appended to the model name following this "
        "separator if the separator is provided"), _same("--lora-separator")),
    FrontendFlag("--tritonserver-log-verbose-level", _GROUP_TRITON, dict(
        type=int, default=0, help="The tritonserver log verbosity level"), _same("--log-verbose")),
    FrontendFlag("--host", _GROUP_TRITON, dict(
        type=str, default="0.0.0.0", help="Address/host of frontends (default: '0.0.0.0')"), _host),
    FrontendFlag("--tool-call-parser", _GROUP_TRITON, dict(
        type=str, default=None, help="Specify the parser for handling tool calling related response text. "
        "Options include: 'llama3' and 'mistral'."), _same("--tool-call-parser")),
    FrontendFlag("--max-tool-call-parse-bytes", _GROUP_TRITON, dict(
        type=int, default=DEFAULT_MAX_TOOL_CALL_PARSE_BYTES, help="Maximum accumulated output (in bytes) that "
        "the streaming tool-call parser will process per request. "
        f"Default: {DEFAULT_MAX_TOOL_CALL_PARSE_BYTES}."), unused=_PARSE_BYTES),
    FrontendFlag("--chat-template", _GROUP_TRITON, dict(
        type=str, default=None, help="The path to the custom Jinja chat template file."), unused=_CHAT_TEMPLATE),
    FrontendFlag("--default-max-tokens", _GROUP_TRITON, dict(
        type=int, default=16, help="The default maximum number of tokens to generate if not specified in the "
        "request. The default is 16."), _same("--default-max-tokens")),
    FrontendFlag("--model-control-mode", _GROUP_TRITON, dict(
        type=str, default="none", choices=["none", "explicit"], help="Specify the mode for model management. "
        "Options are 'none', and 'explicit'."), _same("--model-control-mode")),
    FrontendFlag("--load-model", _GROUP_TRITON, dict(
        type=str, action="append", default=None, help="Name of the model to be loaded on server startup "
        "(repeatable; '*' alone: every model). Needs --model-control-mode=explicit."), _load_models),
    FrontendFlag("--openai-port", _GROUP_OPENAI, dict(
        type=int, default=DEFAULT_OPENAI_PORT, help="OpenAI HTTP port (default: 9000)"), _same("--openai-port")),
    FrontendFlag("--uvicorn-log-level", _GROUP_OPENAI, dict(
        type=str, default="info", choices=["debug", "info", "warning", "error", "critical", "trace"],
        help="log level for uvicorn"), unused=_UVICORN),
    FrontendFlag("--openai-restricted-api", _GROUP_OPENAI, dict(
        type=str, default=None, nargs=3, metavar=("APIs", "Restricted Key", "Restricted Value"),
        action="append", help="Restrict access to specific OpenAI API endpoints. Format: '<API_1>,<API_2>,... "
        "<restricted-key> <restricted-value>'."), _restricted),
    FrontendFlag("--http-max-input-size", _GROUP_OPENAI, dict(
        type=_positive_int, default=HTTP_DEFAULT_MAX_INPUT_SIZE, help="Maximum allowed HTTP request input size "
        f"in bytes for the OpenAI frontend (default: {HTTP_DEFAULT_MAX_INPUT_SIZE}, i.e. 64 MiB)."),
        _same("--http-max-input-size")),
    FrontendFlag("--enable-kserve-frontends", _GROUP_KSERVE, dict(
        action="store_true", help="Enable KServe Predict v2 HTTP/GRPC frontends (disabled by default)"),
        _kserve),
    FrontendFlag("--kserve-http-port", _GROUP_KSERVE, dict(
        type=int, default=8000, help="KServe Predict v2 HTTP port (default: 8000)"), _same("--http-port")),
    FrontendFlag("--kserve-grpc-port", _GROUP_KSERVE, dict(
        type=int, default=8001, help="KServe Predict v2 GRPC port (default: 8001)"), _same("--grpc-port")),
)

# Conveyor's flags beyond main.py's, with the defaults that answer as Triton's frontend does.
EXTENSION_FLAGS: tuple[FrontendFlag, ...] = (
    FrontendFlag("--openai-error-form", _GROUP_CONVEYOR, dict(
        type=str, default=TRITON, choices=list(ERROR_FORMS), help="how the OpenAI port answers a refused "
        "request: triton (Triton's frontend's: 422 with pydantic's detail for a body outside its schema, "
        "{\"detail\": message} otherwise; the default here) or openai (OpenAI's API's and vLLM's {\"error\": "
        "{...}}, conveyor serve's default)"), _same("--openai-error-form")),
)

# What main.py's in-process server does not serve: Triton's metrics port (its /metrics is on the OpenAI
# port, as here the group's own on --metrics-port is off).
FIXED_SERVE_ARGS = ("--allow-metrics", "false")


def add_frontend_flags(parser: argparse.ArgumentParser) -> None:
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in FRONTEND_FLAGS + EXTENSION_FLAGS:
        if f.group not in groups:
            groups[f.group] = parser.add_argument_group(f.group)
        groups[f.group].add_argument(f.flag, **f.options)


def build_frontend_parser(prog: str = "conveyor openai-frontend") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_frontend_flags(parser)
    return parser


def serve_argv(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The tritonserver command line ``args`` stands for, and one line for each flag given that is not used."""
    argv: list[str] = list(FIXED_SERVE_ARGS)
    notes: list[str] = []
    for f in FRONTEND_FLAGS + EXTENSION_FLAGS:
        value = getattr(args, f.dest)
        if f.to_serve is not None:
            argv += f.to_serve(value)
        elif value is not None and value != f.options.get("default"):
            notes.append(f"{f.flag}={value}: accepted, not used by Conveyor because {f.unused}")
    return argv, notes


def check(args: argparse.Namespace) -> str:
    """main.py's own refusal, in its words; '' when the command line is good."""
    if args.load_model and args.model_control_mode != "explicit":
        return "Error: Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
    return ""


def frontend_main(args: argparse.Namespace, command_line: bool) -> int:
    """Run the group ``args`` (main.py's flags, parsed) stands for."""
    from conveyor.deploy.cli import build_tritonserver_parser, run_tritonserver

    problem = check(args)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    argv, notes = serve_argv(args)
    return run_tritonserver(build_tritonserver_parser(), argv, notes, command_line)


def main(argv: list[str] | None = None) -> int:
    return frontend_main(build_frontend_parser().parse_args(argv), argv is None)
