"""Every command-line flag a doc names (``--something``, in prose, tables, inline code and code blocks) is one
that the program it is given to declares.

Whose flag it is comes from the command it is written with: in a code block's command line or an inline code
span, the program word (past ``VAR=value`` and wrappers such as ``sudo``) decides:

* ``conveyor SUB`` (or ``SUB`` alone at the start of inline code, as in `ingress --protocol metrics`) and
  ``tritonserver``: the real argument parsers (deploy/cli.py's, built from deploy/settings.py);
* ``python -m conveyor.X.Y``, ``python path/to/script.py`` or ``script.py`` of this tree: the ``add_argument``
  calls of that file (the benchmarks under deploy/benchmarks, deploy/gpu's scripts);
* any other program (perf_analyzer, curl, pip, docker, helm, kubectl, vllm, ...): its own business, not checked.

A flag written without a command (in prose, in a table, as `--max-queue-size` alone) must be one of
``conveyor``'s or ``tritonserver``'s, or of a script that its section (or a section above it) names. Otherwise
it is reported, unless its paragraph (a paragraph, a list item, a table row) names one of the few other
programs in FOREIGN_PROGRAMS: a doc that cites another program's flag in prose says whose it is.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from conveyor.deploy.cli import build_parser, build_tritonserver_parser
from tests.support import docs as md
from tests.support.paths import ROOT

LEVEL = "unit"

# Other programs whose flags the docs cite in prose ("aiperf's `--concurrency`"). A code block or inline code
# needs none of this: there the command decides. Matched as words, any case, in the flag's paragraph.
FOREIGN_PROGRAMS = ("perf_analyzer", "aiperf", "granian", "gunicorn", "uvicorn", "pip", "pytest", "docker",
                    "helm", "kubectl", "vllm", "model-analyzer", "curl", "nginx", "git")
_FOREIGN = re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(p) for p in FOREIGN_PROGRAMS) + r")(?![\w-])",
                      re.IGNORECASE)

FLAG_WORD = re.compile(r"^(--[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*(?:-\*)?)(?:=.*)?$")
# In prose: a flag not glued to a word, and not followed by "(" (a call drawn in a diagram, "--listing(...)").
FLAG_IN_TEXT = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*(?:-\*)?(?![\w(-])")
SHELL_LANGS = {"", "sh", "bash", "console", "shell", "zsh"}
_PYTHON = re.compile(r"^(?:python[\d.]*|\$\{?PY(?:THON)?\}?|\$\(PY(?:THON)?\))$")


@dataclass(frozen=True)
class Owner:
    label: str  # as a reader would write it: "conveyor serve", "deploy/benchmarks/perf.py", "perf_analyzer"
    flags: frozenset[str] | None  # None: another program's, not checked here


def _option_strings(parser: argparse.ArgumentParser) -> frozenset[str]:
    return frozenset(s for a in parser._actions for s in a.option_strings if s.startswith("--"))


@functools.cache
def conveyor_commands() -> dict[str, frozenset[str]]:
    """``conveyor``'s subcommands, each with its flags, and ``tritonserver``'s."""
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    out = {f"conveyor {name}": _option_strings(sub) for name, sub in subs.items()}
    out["tritonserver"] = _option_strings(build_tritonserver_parser())
    return out


@functools.cache
def own_flags() -> frozenset[str]:
    return frozenset().union(*conveyor_commands().values())


@functools.cache
def script_flags(path: Path) -> frozenset[str]:
    """The long flags a script of this tree declares: the string arguments of its ``add_argument`` calls."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {"--help"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            found.update(a.value for a in node.args
                         if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"))
    return frozenset(found)


@functools.cache
def _tree_scripts() -> dict[str, list[Path]]:
    by_name: dict[str, list[Path]] = {}
    for path in sorted((ROOT / "deploy").rglob("*.py")):
        by_name.setdefault(path.name, []).append(path)
    return by_name


def script(word: str) -> Path | None:
    """This tree's script that ``word`` names (``deploy/benchmarks/perf.py``, ``perf.py``,
    ``conveyor.deploy.benchmarks.perf``), or None."""
    if word.startswith("conveyor."):
        word = word[len("conveyor."):].replace(".", "/") + ".py"
    if (ROOT / word).is_file():
        return ROOT / word
    candidates = _tree_scripts().get(Path(word).name, [])
    return candidates[0] if len(candidates) == 1 and "/" not in word else None


def _script_owner(path: Path) -> Owner:
    rel = str(path.relative_to(ROOT))
    if rel == "deploy/cli.py":
        return Owner("conveyor", own_flags())
    return Owner(rel, script_flags(path))


def declared(flag: str, flags: frozenset[str]) -> bool:
    """``flag`` is one of ``flags``; a family written ``--grpc-keepalive-*`` is when one of them is in it."""
    if flag.endswith("*"):
        return any(fnmatch.fnmatchcase(f, flag) for f in flags)
    return flag in flags


def resolve(command: list[str], span: bool) -> tuple[Owner | None, int]:
    """The program a simple command runs (None: none, the flags' owner is the context's) and the index of its
    first argument. In inline code (``span``) an unknown first word is a program only when a flag follows it
    or FOREIGN_PROGRAMS names it: otherwise the span is a message or a value, not a command line."""
    k = md.command_start(command)
    if k >= len(command) or command[k].startswith("-"):
        return None, k
    word, name = command[k], Path(command[k]).name
    subcommands = {c.split(" ", 1)[1] for c in conveyor_commands() if c.startswith("conveyor ")}
    if name == "conveyor":
        if k + 1 < len(command) and command[k + 1] in subcommands:
            return Owner(f"conveyor {command[k + 1]}", conveyor_commands()[f"conveyor {command[k + 1]}"]), k + 2
        return Owner("conveyor", own_flags()), k + 1
    if name == "tritonserver":
        return Owner("tritonserver", conveyor_commands()["tritonserver"]), k + 1
    if span and word in subcommands:
        return Owner(f"conveyor {word}", conveyor_commands()[f"conveyor {word}"]), k + 1
    if _PYTHON.match(name):
        rest = command[k + 1:]
        if len(rest) >= 2 and rest[0] == "-m":
            own = script(rest[1]) if rest[1].startswith("conveyor.") else None
            if rest[1] == "conveyor.deploy.cli" and len(rest) > 2 and rest[2] in subcommands:
                return Owner(f"conveyor {rest[2]}", conveyor_commands()[f"conveyor {rest[2]}"]), k + 4
            return (_script_owner(own) if own else Owner(f"python -m {rest[1]}", None)), k + 3
        if rest and rest[0].endswith(".py"):
            own = script(rest[0])
            return (_script_owner(own) if own else Owner(rest[0], None)), k + 2
        return Owner(name, None), k + 1
    if name.endswith(".py"):
        own = script(word)
        return (_script_owner(own) if own else Owner(word, None)), k + 1
    if span and name.lower() not in FOREIGN_PROGRAMS and not (k + 1 < len(command) and command[k + 1].startswith("-")):
        return None, k  # inline code that is no command line: a message, a value (`request JSON size ... --flag`)
    return Owner(word, None), k + 1  # another program, or a shell script of ours: flags not checked


@dataclass(frozen=True)
class Mention:
    doc: str
    line: int
    flag: str
    owner: Owner | None  # None: written without a command
    paragraph: str  # the text around it, for an unowned flag: its paragraph (or code line)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def _words_mentions(doc: str, line: int, words: list[str], span: bool, around: str) -> list[Mention]:
    out = []
    for command in md.commands(words):
        owner, start = resolve(command, span)
        for word in command[start:] if owner is not None else command:
            m = FLAG_WORD.match(word)
            if m:
                out.append(Mention(doc, line, m.group(1), owner, around))
    return out


def _arrow_label(text: str, end: int) -> bool:
    """``--drain grace over-->`` in a diagram: the text after it reaches an arrow's head before any other flag."""
    rest = text[end:].split("\n", 1)[0].split(" --", 1)[0]
    return "->" in rest


def _prose_mentions(p: md.Paragraph) -> list[Mention]:
    out = []
    for span in md.inline_code(p):
        words = md.tokens(span.text) or span.text.split()
        out += _words_mentions(p.doc, span.line, words, True, p.text)
    text = md.prose_text(p)
    for m in FLAG_IN_TEXT.finditer(text):
        if not _arrow_label(text, m.end()):
            out.append(Mention(p.doc, p.line + text.count("\n", 0, m.start()), m.group(0), None, p.text))
    return out


def mentions(doc: md.Doc) -> list[Mention]:
    out = []
    for p in doc.paragraphs:
        out += _prose_mentions(p)
    for block in doc.blocks:
        if block.lang in SHELL_LANGS:
            for sl in md.shell_lines(block):
                out += _words_mentions(doc.rel, sl.line, sl.words, False, sl.text)
        else:  # yaml, python, ...: flags in their strings and comments, read as prose
            for k, line in enumerate(block.lines):
                out += _prose_mentions(md.Paragraph(doc.rel, block.first + k, line, False))
    return out


_SCRIPT_NAMES = re.compile(r"(?:conveyor\.deploy\.[\w.]+|[\w/]*\w\.py)\b")


def section_scripts(doc: md.Doc, line: int) -> list[Path]:
    """The scripts of this tree named in the section holding ``line`` or a section above it."""
    found: list[Path] = []
    for first, last in doc.section_chain(line):
        for name in _SCRIPT_NAMES.findall(doc.text_of(first, last)):
            path = script(name)
            if path is not None and path not in found and script_flags(path) != {"--help"}:
                found.append(path)
    return found


def problem(doc: md.Doc, m: Mention) -> str | None:
    """Why ``m`` is wrong, or None."""
    if m.flag == "--help":
        return None
    if m.owner is not None:
        if m.owner.flags is None or declared(m.flag, m.owner.flags):
            return None
        return f"{m.where}: `{m.flag}` is not a flag of `{m.owner.label}`"
    if declared(m.flag, own_flags()):
        return None
    scripts = section_scripts(doc, m.line)
    if any(declared(m.flag, script_flags(s)) for s in scripts):
        return None
    if _FOREIGN.search(m.paragraph):
        return None
    named = ", ".join(str(s.relative_to(ROOT)) for s in scripts) or "none"
    return (f"{m.where}: `{m.flag}` is no flag of `conveyor` or `tritonserver`, nor of a script its section names "
            f"({named}); if it is another program's, write it with that program")


def test_every_flag_a_doc_names_exists() -> None:
    problems = [p for doc in md.docs() for m in mentions(doc) if (p := problem(doc, m)) is not None]
    assert not problems, f"{len(problems)} flags in the docs that no parser declares:\n" + "\n".join(problems)


def test_the_checks_see_the_flags() -> None:
    """The parsing behind the check finds flags where the docs write them (a check that sees nothing passes)."""
    doc = md.parse(ROOT / "docs" / "EXAMPLE.md", "\n".join([
        "# T", "",
        "Set `--max-queue-size` and --no-such-flag; `vs_triton.py --passes 2 --nope`.", "",
        "| `--backlog 2048` | granian's |", "",
        "    conveyor serve --workers 2 \\", "        --bogus", "    perf_analyzer --concurrency-range 1:4", "",
        "```", "SERVING --SIGTERM--> GRACE --drain grace over--> DONE (or --exit-timeout-secs)", "```", "",
        "```console", "$ tritonserver --model-repository=/m --made-up", "--output-looking-line", "```",
    ]))
    found = {(m.flag, m.owner.label if m.owner else None) for m in mentions(doc)}
    assert {("--max-queue-size", None), ("--no-such-flag", None), ("--passes", "deploy/benchmarks/vs_triton.py"),
            ("--nope", "deploy/benchmarks/vs_triton.py"), ("--backlog", None), ("--workers", "conveyor serve"),
            ("--bogus", "conveyor serve"), ("--concurrency-range", "perf_analyzer"),
            ("--model-repository", "tritonserver"), ("--made-up", "tritonserver")} <= found, found
    assert "--output-looking-line" not in {f for f, _ in found}  # console output, not a command
    wrong = sorted(m.flag for m in mentions(doc) if problem(doc, m))
    assert wrong == ["--bogus", "--made-up", "--no-such-flag", "--nope"], wrong
