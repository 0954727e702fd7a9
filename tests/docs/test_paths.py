"""Every file, folder, link and section a doc names exists in this tree.

* Markdown links (``[text](target)``): the target exists, relative to the doc; ``#anchor`` (in the same doc or
  in ``FILE.md#anchor``) is one of the target's headings, as GitHub makes their ids.
* Repository paths, wherever written (prose, inline code, code blocks): a word starting with one of the tree's
  top-level names (``router/…``, ``deploy/…``, ``tests/…``, ``docs/…``, ``README.md``, …) is a file or folder of
  the tree. ``<name>`` and ``*`` are wildcards (one match is enough), ``{a,b}`` stands for each of its words,
  ``::test_x`` (a pytest node) and a trailing ``:LINE`` are dropped. A path right after "Triton's" or another
  project's name (NOT_OURS) is that project's.
* A bare file name (``polling.py``, ``SCHEDULING.md``) is some file of the tree, unless its section also names
  files of another project's tree (a path whose first folder is not one of ours, such as Triton's ``qa/…``).
* ``python -m conveyor.X.Y`` and ``conveyor.X.Y`` module names are modules of the tree.
* A section cited by name, ``FILE.md, "Heading"``, is a heading of FILE.
* ``make TARGET`` is a target of the Makefile.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from tests.support import docs as md
from tests.support.paths import ROOT

LEVEL = "unit"

# Not part of the tree: what the build, tools and caches leave in a checkout.
IGNORED = {".git", "build", "__pycache__", ".venv", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis",
           "bench-results", ".whl", ".cache", ".schemathesis"}
# Projects whose paths the docs cite right after their name ("Triton's `docs/examples/model_repository`").
NOT_OURS = ("Triton's", "triton-inference-server", "vLLM's", "python_backend's", "client repository's")


@functools.cache
def tree() -> tuple[str, ...]:
    """Every file and folder of the tree, relative to its root, folders with a trailing ``/``."""
    out: list[str] = []

    def walk(folder: Path) -> None:
        for entry in sorted(folder.iterdir()):
            if entry.name in IGNORED or entry.name.endswith(".egg-info"):
                continue
            rel = str(entry.relative_to(ROOT))
            if entry.is_dir() and not entry.is_symlink():
                out.append(rel + "/")
                walk(entry)
            else:
                out.append(rel)

    walk(ROOT)
    return tuple(out)


@functools.cache
def top_level() -> tuple[str, ...]:
    return tuple(p.rstrip("/") for p in tree() if "/" not in p.rstrip("/") and not p.startswith("."))


@functools.cache
def basenames() -> frozenset[str]:
    return frozenset(Path(p.rstrip("/")).name for p in tree())


def _expand(pattern: str) -> list[str]:
    """``{a,b}`` as each of its words (nested groups not needed)."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", pattern)
    if not m:
        return [pattern]
    head, tail = pattern[:m.start()], pattern[m.end():]
    return [x for word in m.group(1).split(",") for x in _expand(head + word.strip() + tail)]


def exists(path: str) -> bool:
    """``path`` (wildcards and ``{a,b}`` allowed) names a file or folder of the tree."""
    for one in _expand(path):
        glob = re.sub(r"<[^<>]*>", "*", one).replace("...", "*").replace("…", "*")
        if glob.endswith("/"):
            glob = glob.rstrip("/") + "/"
        if not any(fnmatch.fnmatchcase(p, glob) or fnmatch.fnmatchcase(p, glob.rstrip("/") + "/")
                   or fnmatch.fnmatchcase(p.rstrip("/"), glob.rstrip("/")) for p in tree()):
            return False
    return True


@dataclass(frozen=True)
class Named:
    doc: str
    line: int
    text: str  # as the doc writes it
    before: str  # the text just before it, same line

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def texts(doc: md.Doc) -> list[tuple[int, str]]:
    """Every line of prose and code of ``doc``, with its number (the code spans kept, for paths in them)."""
    return [(n, line) for n, line in enumerate(doc.lines, 1) if not md_comment(line)]


def md_comment(line: str) -> bool:
    return line.strip().startswith("<!--")


def _path_pattern() -> re.Pattern[str]:
    tops = "|".join(re.escape(t) for t in sorted(top_level(), key=len, reverse=True))
    # A path starts at a word boundary (not inside a URL, an absolute path or another path) with a top-level name.
    return re.compile(rf"(?<![\w./@:~$-])(?:{tops})(?:/[\w.*{{}},<>…@:+-]*)*")


def tree_paths(doc: md.Doc) -> list[Named]:
    pattern = _path_pattern()
    out = []
    for n, line in texts(doc):
        for m in pattern.finditer(line):
            text = re.sub(r"::.*$", "", m.group(0))  # a pytest node id: its file
            text = re.sub(r":\d+(-\d+)?$", "", text).rstrip(".,:;")
            if text in top_level() or "/" in text:
                out.append(Named(doc.rel, n, text, line[:m.start()]))
    return out


_BARE = re.compile(r"(?<![\w./@:~$<-])[\w-]+\.(?:py|md|sh)(?![\w/])")
# A model repository's files, which the docs name as Triton does: the user's, not the tree's.
USER_FILES = {"model.py"}


def bare_names(doc: md.Doc) -> list[Named]:
    """File names written alone, in inline code (``polling.py``) or as a doc's name in prose (SCHEDULING.md)."""
    out = []
    for span in doc.spans:
        for word in span.text.split():
            word = word.strip("`'\",;()[]")
            if _BARE.fullmatch(word):
                out.append(Named(doc.rel, span.line, word, span.paragraph.text[:span.start].rsplit("\n", 1)[-1]))
    for p in doc.paragraphs:
        text = md.prose_text(p)
        for m in re.finditer(r"(?<![\w./-])[A-Z][A-Z-]+\.md\b", text):
            out.append(Named(doc.rel, p.line + text.count("\n", 0, m.start()), m.group(0), ""))
    return out


def _foreign_tree_named(doc: md.Doc, line: int) -> bool:
    """The section holding ``line`` names files of another project: a path whose first folder is not ours."""
    first, last = doc.section(line)
    for word in re.findall(r"(?<![\w./~$-])([\w-]+)/[\w-]+", doc.text_of(first, last)):
        if word not in top_level() and not word.startswith(".") and word.islower() and word not in {"s3", "gs", "as"}:
            return True
    return False


def _not_ours(before: str) -> bool:
    before = before.rstrip(" `(")
    return any(before.endswith(owner) for owner in NOT_OURS)


def test_every_link_resolves() -> None:
    problems = []
    for doc in md.docs():
        for p in doc.paragraphs:
            text = md.prose_text(p)
            for m in re.finditer(r"\]\(([^)\s]+)\)", text):
                line = p.line + text.count("\n", 0, m.start())
                problems += link_problems(doc, line, m.group(1))
    assert not problems, f"{len(problems)} links in the docs lead nowhere:\n" + "\n".join(problems)


def link_problems(doc: md.Doc, line: int, target: str) -> list[str]:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: outside the tree
        return []
    path, _, anchor = target.partition("#")
    where = f"{doc.rel}:{line}"
    if not path:
        anchors = doc.anchors
        name = doc.path.name
    else:
        dest = (doc.path.parent / path).resolve()
        if not dest.exists():
            return [f"{where}: link to `{target}`: no such file or folder"]
        if dest.suffix != ".md" or not anchor:
            return []
        anchors, name = md.parse(dest).anchors, dest.name
    if anchor and anchor not in anchors:
        return [f"{where}: link to `{target}`: {name} has no heading with the id `{anchor}`"]
    return []


def test_every_path_a_doc_names_exists() -> None:
    problems = []
    for doc in md.docs():
        for named in tree_paths(doc):
            if not _not_ours(named.before) and not exists(named.text):
                problems.append(f"{named.where}: `{named.text}`: no such file or folder in the tree")
        for named in bare_names(doc):
            if (named.text in basenames() or named.text in USER_FILES or _not_ours(named.before)
                    or _foreign_tree_named(doc, named.line)):
                continue
            problems.append(f"{named.where}: `{named.text}`: no file of that name in the tree")
        problems += anchored_problems(doc)
    assert not problems, f"{len(problems)} paths in the docs that the tree does not have:\n" + "\n".join(problems)


def anchored_problems(doc: md.Doc) -> list[str]:
    """``FILE.md#anchor`` outside links, and sections cited as ``FILE.md, "Heading"``."""
    problems = []
    for n, line in texts(doc):
        for m in re.finditer(r"(?<![\w/(:.-])((?:[\w-]+/)*[\w-]+\.md)#([\w-]+)", line):
            if f"]({m.group(0)}" not in line:  # links are checked by test_every_link_resolves
                problems += link_problems(doc, n, m.group(0))
    for p in doc.paragraphs:
        text = p.text.replace("\n", " ")
        for m in re.finditer(r"(?<![\w/:.-])((?:[\w-]+/)*[\w-]+\.md)`?\)?,? \"([^\"]+)\"", text):
            target = _doc_named(doc, m.group(1))
            if target is None:
                continue  # the path check reports it
            if not cites_section(md.parse(target), m.group(2)):
                at = p.line + p.text.count("\n", 0, m.start())
                problems.append(f"{doc.rel}:{at}: section \"{m.group(2)}\" of {m.group(1)}: no heading (nor bold "
                                "lead) of that name")
    return problems


def cites_section(doc: md.Doc, name: str) -> bool:
    """``name`` is how a heading of ``doc`` starts ("Waiting requests" for "Waiting requests: `MAX_...`"), or a
    paragraph's bold lead (``**What the engines evicted.**``)."""
    cited = md.github_anchor(name)
    leads = [m.group(1) for p in doc.paragraphs
             if (m := re.match(r"^\s*(?:[-*]\s+|\d+\.\s+)?\*\*(.+?)\*\*", p.text))]
    return any(a == cited or a.startswith(cited + "-")
               for a in [h.anchor for h in doc.headings] + [md.github_anchor(lead) for lead in leads])


def _doc_named(doc: md.Doc, name: str) -> Path | None:
    for base in (doc.path.parent, ROOT, ROOT / "docs"):
        if (base / name).is_file():
            return base / name
    return None


_MODULE = re.compile(r"(?<![\w.])conveyor\.([a-z_][\w]*(?:\.[\w<>*]+)*)")


def module_problem(dotted: str) -> str | None:
    """Why ``conveyor.<dotted>`` names no module of the tree (or no attribute of one), or None."""
    parts = dotted.rstrip(".").split(".")
    for k in range(len(parts), 0, -1):
        rel = "/".join(parts[:k])
        if exists(rel + ".py") or exists(rel + "/"):
            rest = parts[k:]
            if not rest:
                return None
            source = ROOT / (rel + ".py") if (ROOT / (rel + ".py")).is_file() else ROOT / rel / "__init__.py"
            text = source.read_text(encoding="utf-8") if source.is_file() else ""
            pattern = rf"^(?:async\s+def|def|class)\s+{re.escape(rest[0])}\b|^{re.escape(rest[0])}\s*[:=]"
            if len(rest) == 1 and re.search(pattern, text, re.MULTILINE):
                return None
            return f"{rel} has no `{'.'.join(rest)}`"
    return f"no {'/'.join(parts)}.py in the tree"


def test_every_module_a_doc_names_exists() -> None:
    """``python -m conveyor.deploy.benchmarks.perf``, ``conveyor.ingress.http.app.build_app`` and the like name
    modules (or a module's function or class) of this tree."""
    packages = {t for t in top_level() if (ROOT / t / "__init__.py").is_file()}
    problems = []
    for doc in md.docs():
        for n, line in texts(doc):
            for m in _MODULE.finditer(line):
                if m.group(1).split(".")[0] not in packages:
                    continue  # conveyor.latency_target_us (a parameter), conveyor.* (the namespace)
                why = module_problem(m.group(1))
                if why:
                    problems.append(f"{doc.rel}:{n}: module `conveyor.{m.group(1)}`: {why}")
    assert not problems, f"{len(problems)} modules in the docs that the tree does not have:\n" + "\n".join(problems)


@functools.cache
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return frozenset(t for line in re.findall(r"^([\w. -]+):(?!=)", text, re.MULTILINE) for t in line.split())


def make_commands(doc: md.Doc) -> list[tuple[int, list[str]]]:
    """The ``make`` command lines of inline code and code blocks, with their lines."""
    found = [(span.line, words) for span in doc.spans if (words := md.tokens(span.text))]
    found += [(sl.line, sl.words) for block in doc.blocks if block.lang in {"", "sh", "bash", "console", "shell"}
              for sl in md.shell_lines(block)]
    out = []
    for line, words in found:
        for command in md.commands(words):
            k = md.command_start(command)
            if k < len(command) and command[k] == "make":
                out.append((line, command[k:]))
    return out


def test_every_make_target_a_doc_names_exists() -> None:
    problems = []
    for doc in md.docs():
        for line, command in make_commands(doc):
            targets = [w for w in command[1:] if not w.startswith("-") and "=" not in w]
            problems += [f"{doc.rel}:{line}: `{' '.join(command)}`: the Makefile has no target `{t}`"
                         for t in targets if t not in make_targets()]
    assert not problems, "\n".join(problems)


def make_rules() -> dict[str, tuple[list[str], list[str]]]:
    """The Makefile's rules: target -> (prerequisites, recipe lines)."""
    rules: dict[str, tuple[list[str], list[str]]] = {}
    current: list[str] = []
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        if line.startswith("\t") and current:
            for target in current:
                rules[target][1].append(line.strip())
        elif (m := re.match(r"^([^:#=\t][^:=]*):(?!=)(.*)$", line)):
            current = m.group(1).split()
            for target in current:
                rules[target] = (m.group(2).split("#")[0].split(), [])
        elif line.strip() and not line.startswith("#"):
            current = []
    return rules


def test_the_readme_two_commands_do_what_it_says() -> None:
    """README: ``make serve`` and ``make test`` make the ``.venv`` first; ``make test`` lints, type-checks and
    runs the whole suite (its ``serve`` flags: tests/docs/test_examples.py)."""
    rules = make_rules()
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^VENV \?= \.venv$", makefile, re.MULTILINE)
    assert any("-m venv $(VENV)" in line for line in rules["$(PY)"][1])
    for target in ("serve", "test"):
        assert "$(PY)" in rules[target][0], f"make {target} does not make the virtual environment first"

    def reached(target: str) -> set[str]:
        deps, recipe = rules.get(target, ([], []))
        called = [m for line in recipe for m in re.findall(r"\$\(MAKE\) (\w+)", line)]
        return {target}.union(*(reached(t) for t in deps + called if t in rules and t != "$(PY)"))

    recipes = " ; ".join(line for t in reached("test") for line in rules[t][1])
    for tool in ("ruff check .", "mypy -p conveyor -p tests"):
        assert tool in recipes, f"make test does not run `{tool}`"
    pytest_runs = [line for t in reached("test") for line in rules[t][1] if "-m pytest" in line]
    assert pytest_runs and all(" -m unit" not in line and "-k " not in line for line in pytest_runs), pytest_runs


def test_the_checks_see_paths_links_and_sections() -> None:
    """What the checks read, on a made-up doc: a check that sees nothing passes whatever the docs say."""
    doc = md.parse(ROOT / "docs" / "EXAMPLE.md", "\n".join([
        "# Title", "", "## `conveyor serve` and more", "",
        "See [this](#conveyor-serve-and-more), [that](#nowhere), [CLI](CLI.md#conveyor-serve),",
        "[gone](GONE.md) and docs/SCHEDULING.md, \"No such heading\"; `deploy/no_such.py`,",
        "`deploy/benchmarks/<name>.py`, `router/{batcher,no_such}.py`, `polling.py`, `nonexistent.py`, and",
        "Triton's `docs/examples/model_repository`.",
    ]))
    links = [p for n, _ in enumerate(doc.lines, 1) for m in re.finditer(r"\]\(([^)\s]+)\)", doc.lines[n - 1])
             for p in link_problems(doc, n, m.group(1))]
    assert [p.split("`")[1] for p in links] == ["#nowhere", "GONE.md"], links
    missing = [named.text for named in tree_paths(doc) if not _not_ours(named.before) and not exists(named.text)]
    assert missing == ["deploy/no_such.py", "router/{batcher,no_such}.py"], missing
    assert [n.text for n in bare_names(doc) if n.text not in basenames()] == ["nonexistent.py", "GONE.md"]
    assert [p.split(": ", 1)[1].split(":")[0] for p in anchored_problems(doc)] == [
        'section "No such heading" of docs/SCHEDULING.md']
    assert cites_section(md.parse(ROOT / "docs" / "SCHEDULING.md"), "Waiting requests")
    assert module_problem("deploy.benchmarks.perf") is None and module_problem("ingress.http.app.build_app") is None
    assert module_problem("ingress.http.app.no_such") and module_problem("deploy.no_such")
    assert list(itertools.chain(_expand("a/{b,c}/d"))) == ["a/b/d", "a/c/d"]
    headings = md.parse(ROOT / "X.md", "# A b\n\n## A b\n\n### `--x` (y), [z](Z.md): µs & *w*").headings
    assert [h.anchor for h in headings] == ["a-b", "a-b-1", "--x-y-z-µs--w"]
