"""docs/CLI.md, rendered from the real argument parsers: every flag of every ``conveyor``
subcommand and of ``tritonserver``, with its value, default and help text.

    python deploy/cli_doc.py > docs/CLI.md

``tests/deploy/test_cli_doc.py`` fails when docs/CLI.md is not what this writes now. The output
depends on the parsers only: help text is laid out here (not by argparse, whose wrapping follows
the terminal's width), and defaults that the environment can change (``$CONVEYOR_*``, Vertex AI's
``$AIP_*``, SageMaker's ``$SAGEMAKER_*``) are rendered as they are with none of those set.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

REGENERATE = "python deploy/cli_doc.py > docs/CLI.md"
# Environment variables that parsers read for their defaults: unset while the parsers are built.
ENV_PREFIXES = ("CONVEYOR_", "AIP_", "SAGEMAKER_")

Row = tuple[str, str, str, str]  # flag(s), value, default, help: markdown cells


@contextmanager
def _plain_environment() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


def _escape(text: str) -> str:
    """Plain text safe in a markdown table cell: no column breaks, tags or emphasis."""
    for ch in ("\\", "|", "<", "*"):
        text = text.replace(ch, "\\" + ch)
    return text


def _code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:  # argparse's own expansion of %(default)s, %(prog)s, ...
        params: dict[str, Any] = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
        params["prog"] = prog
        if params.get("choices") is not None:
            params["choices"] = ", ".join(str(c) for c in params["choices"])
        text = text % params
    return _escape(" ".join(text.split()))


def _kind(kind: Any) -> str:
    """A value's kind from its parser type: int, float and str by name, a converter by its name."""
    if kind is None or kind is str:
        return "TEXT"
    name = getattr(kind, "__name__", "")
    for word, shown in (("int", "INT"), ("float", "FLOAT"), ("bool", "BOOL")):
        if word in name:
            return shown
    return "VALUE"


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "(switch)"
    if action.choices is not None:
        shown = _code("|".join(str(c) for c in action.choices))
    elif action.metavar is not None:
        metavar = action.metavar
        shown = _code(" ".join(metavar) if isinstance(metavar, tuple) else str(metavar))
    else:
        shown = _code(_kind(action.type))
    if action.nargs == "?":
        shown += " (optional)"
    elif action.nargs in ("*", "+") or isinstance(action.nargs, int):
        shown += " ..."
    if isinstance(action, argparse._AppendAction):
        shown += " (repeatable)"
    if action.required and action.option_strings:
        shown += " (required)"
    return shown


def _default(action: argparse.Action) -> str:
    value = action.default
    if value is None or value == [] or value is argparse.SUPPRESS:
        return "—"
    if isinstance(value, bool):
        return _code(str(value).lower())
    if isinstance(value, int) and value >= 1 << 20 and any(w in action.dest for w in ("size", "bytes")):
        for unit, shift in (("GiB", 30), ("MiB", 20)):
            if value % (1 << shift) == 0:
                return f"{_code(str(value))} ({value >> shift} {unit})"
    if isinstance(value, str) and value == "":
        return _code('""')
    return _code(str(value))


def _row(action: argparse.Action, prog: str) -> Row:
    names = ", ".join(_code(s) for s in action.option_strings) or _code(action.dest)
    return names, _value(action), _default(action), _help(action, prog)


def _documented(parser: argparse.ArgumentParser) -> Iterator[tuple[str, list[argparse.Action]]]:
    """The parser's argument groups in order, with the actions a reader needs (no --help)."""
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        if group is parser._positionals:
            title = "Arguments"
        elif group is parser._optionals:
            title = "Options"
        else:
            title = group.title or "Options"
        yield title, actions


def _table(rows: list[Row], first: str = "flag") -> list[str]:
    out = [f"| {first} | value | default | what it does |", "|---|---|---|---|"]
    out += [f"| {flag} | {value} | {default} | {text} |" for flag, value, default, text in rows]
    return out


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _key(action: argparse.Action, prog: str) -> tuple[tuple[str, ...], Row]:
    return tuple(action.option_strings), _row(action, prog)


def _command(name: str, about: str, parser: argparse.ArgumentParser, prog: str,
             shared: dict[tuple[str, ...], Row] | None) -> list[str]:
    """One subcommand's section. With ``shared`` (serve's rows), the flags that read exactly as
    they do for ``conveyor serve`` are named in one line instead of repeated."""
    out = [f"## `{prog}`", ""]
    if about:
        out += [_escape(about[0].upper() + about[1:]) + ".", ""]
    same: list[str] = []
    for title, actions in _documented(parser):
        rows = []
        for action in actions:
            key, row = _key(action, prog)
            if shared is not None and action.option_strings and shared.get(key) == row:
                same.append(action.option_strings[0])
            else:
                rows.append(row)
        if rows:
            out += [f"### {title}" if title != "Options" or shared is None else "### Its own options", ""]
            out += [*_table(rows, "argument" if title == "Arguments" else "flag"), ""]
    if same:
        out += ["### Shared with `conveyor serve`", "",
                "These read exactly as under [`conveyor serve`](#conveyor-serve) (value, default, help): "
                + ", ".join(_code(s) for s in same) + ".", ""]
    return out


def _tritonserver(serve: argparse.ArgumentParser, triton: argparse.ArgumentParser) -> list[str]:
    serve_actions = {tuple(a.option_strings): a for _, acts in _documented(serve) for a in acts}
    triton_actions = {tuple(a.option_strings): a for _, acts in _documented(triton) for a in acts}
    out = ["## `tritonserver`", "",
           "Triton's command line, running the same group as `conveyor serve`. It takes the flags of "
           "[`conveyor serve`](#conveyor-serve), with the same meanings; these defaults differ "
           "(Triton's), and `--model-repository` is required.", ""]
    rows = [(_code(a.option_strings[0]), _default(serve_actions[k]), _default(a))
            for k, a in triton_actions.items() if k in serve_actions and a.default != serve_actions[k].default]
    out += ["| flag | `conveyor serve` | `tritonserver` |", "|---|---|---|"]
    out += [f"| {flag} | {ours} | {theirs} |" for flag, ours, theirs in rows]
    out.append("")
    only_serve = [k for k in serve_actions if k not in triton_actions]
    if only_serve:
        out += ["Not taken by `tritonserver`: " + ", ".join(_code(k[0]) for k in only_serve) + ".", ""]
    only_triton = [a for k, a in triton_actions.items() if k not in serve_actions]
    if only_triton:
        out += ["### Its own options", "", *_table([_row(a, "tritonserver") for a in only_triton]), ""]
    return out


def render() -> str:
    """docs/CLI.md as the parsers define it now."""
    from conveyor.deploy.cli import build_parser, build_tritonserver_parser

    with _plain_environment():
        parser = build_parser()
        triton = build_tritonserver_parser()
    commands = _subcommands(parser)
    out = ["# Command line", "",
           f"<!-- Generated by deploy/cli_doc.py from the argument parsers: do not edit. Regenerate: {REGENERATE} -->",
           "",
           "Every flag of `conveyor` and `tritonserver`, read from their argument parsers "
           f"(`{REGENERATE}` writes this file; a test fails when it is out of date). Triton's flags keep "
           "Triton's meaning; booleans take `true`/`false` (also `1`/`0`, `yes`/`no`, `on`/`off`). "
           "Defaults are shown with no `CONVEYOR_*`, `AIP_*` or `SAGEMAKER_*` variable set: where one "
           "changes a default, the flag's text says so.", ""]
    out += [f"- [`conveyor {name}`](#conveyor-{name}): {_escape(about)}" for name, about, _ in commands]
    out += ["- [`tritonserver`](#tritonserver): Triton's command line, the same group as `conveyor serve`", ""]
    serve = next((sub for name, _, sub in commands if name == "serve"), None)
    shared = {_key(a, "conveyor serve")[0]: _key(a, "conveyor serve")[1]
              for _, acts in _documented(serve) for a in acts} if serve is not None else None
    for name, about, sub in commands:
        out += _command(name, about, sub, f"conveyor {name}", None if name == "serve" else shared)
    if serve is not None:
        out += _tritonserver(serve, triton)
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def main() -> int:
    sys.stdout.buffer.write(render().encode("utf-8"))
    return 0


if __name__ == "__main__":
    # Run as a script, this folder is sys.path[0]: its modules must not shadow others by name.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    sys.exit(main())
