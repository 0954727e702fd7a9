"""docs/CLI.md is what deploy/cli_doc.py renders from the argument parsers now, whatever the
environment or terminal it is rendered in, and it names every flag of every command."""

from __future__ import annotations

import argparse
import difflib

import pytest

from conveyor.deploy import cli_doc
from conveyor.deploy.cli import build_parser, build_tritonserver_parser
from tests.support.paths import ROOT

LEVEL = "unit"

CLI_MD = ROOT / "docs" / "CLI.md"


def test_cli_md_is_what_the_generator_writes() -> None:
    written = CLI_MD.read_text(encoding="utf-8") if CLI_MD.exists() else ""
    rendered = cli_doc.render()
    if written != rendered:
        diff = list(difflib.unified_diff(written.splitlines(), rendered.splitlines(), "docs/CLI.md (in the tree)",
                                         "docs/CLI.md (from the parsers now)", lineterm="", n=1))
        shown = "\n".join(diff[:40]) + ("\n..." if len(diff) > 40 else "")
        pytest.fail(f"docs/CLI.md is out of date: regenerate it with `{cli_doc.REGENERATE}`\n{shown}", pytrace=False)


def test_rendering_ignores_the_environment_and_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = cli_doc.render()
    for key, value in {"COLUMNS": "40", "LINES": "10", "CONVEYOR_GRPC_SERVER": "grpcio", "AIP_MODE": "PREDICTION",
                       "AIP_HTTP_PORT": "9090", "CONVEYOR_IO_SCHED": "normal"}.items():
        monkeypatch.setenv(key, value)
    assert cli_doc.render() == plain


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")}


def test_every_flag_of_every_command_is_in_the_doc() -> None:
    text = cli_doc.render()
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert commands, "no subcommands found"
    for name, sub in commands.items():
        section = text.split(f"## `conveyor {name}`", 1)[1].split("\n## ", 1)[0]
        missing = [flag for flag in sorted(_flags(sub)) if f"`{flag}`" not in section]
        assert not missing, f"conveyor {name}: {missing} not in its section"
    triton_section = text.split("## `tritonserver`", 1)[1]
    # tritonserver's flags are serve's (the section names those whose defaults differ), or its own.
    missing = [flag for flag in sorted(_flags(build_tritonserver_parser()) - _flags(commands["serve"]))
               if f"`{flag}`" not in triton_section]
    assert not missing, f"tritonserver: {missing} not in its section"
