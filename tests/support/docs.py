"""The repository's markdown as the doc tests read it (README.md, ARCHITECTURE.md, docs/*.md), parsed once:
headings with their GitHub anchors, code blocks (fenced and indented) with the HTML comments just before them,
prose split into paragraphs (a paragraph, a list item, a table row), the inline code in each, links; and shell
text split into commands, so that a flag is judged by the command it is given to.

It reads files only: the tests in tests/docs/ say what must hold."""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.paths import ROOT


def doc_paths() -> list[Path]:
    """Every doc the suite keeps true: the two at the top of the tree and the markdown under docs/."""
    return [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Heading:
    line: int
    level: int
    text: str
    anchor: str


@dataclass(frozen=True)
class Comment:
    line: int
    text: str  # inside <!-- -->, stripped


@dataclass(frozen=True)
class CodeBlock:
    doc: str
    line: int  # the opening fence's line (an indented block's first line)
    first: int  # the line of its first content line
    lang: str  # the fence's info word, lower case; "" for an untyped fence or an indented block
    lines: tuple[str, ...]  # the content, with the block's indentation removed
    comments: tuple[Comment, ...]  # the HTML comments just before it (blank lines between them allowed)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass(frozen=True)
class Paragraph:
    doc: str
    line: int
    text: str  # its lines joined with "\n" (a table row or list item keeps its marker)
    table_row: bool


@dataclass(frozen=True)
class InlineCode:
    paragraph: Paragraph
    line: int
    text: str  # the content, line breaks as spaces, a table's \| as |
    start: int  # offset in paragraph.text of the opening backticks
    end: int  # offset just past the closing backticks


@dataclass
class Doc:
    path: Path
    rel: str
    lines: list[str]
    headings: list[Heading] = field(default_factory=list)
    blocks: list[CodeBlock] = field(default_factory=list)
    paragraphs: list[Paragraph] = field(default_factory=list)
    comments: list[Comment] = field(default_factory=list)

    @functools.cached_property
    def spans(self) -> list[InlineCode]:
        return [span for p in self.paragraphs for span in inline_code(p)]

    @functools.cached_property
    def anchors(self) -> set[str]:
        return {h.anchor for h in self.headings}

    def section(self, line: int) -> tuple[int, int]:
        """The lines [first, last] of the innermost section holding ``line`` (heading to next heading)."""
        first, last = 1, len(self.lines)
        for h in self.headings:
            if h.line <= line:
                first = h.line
            elif h.line > line:
                last = h.line - 1
                break
        return first, last

    def section_chain(self, line: int) -> list[tuple[int, int]]:
        """The section holding ``line`` and each section above it, their own text only (heading to next heading)."""
        chain = []
        level = 7
        bounds = [h.line for h in self.headings] + [len(self.lines) + 1]
        for i in range(len(self.headings) - 1, -1, -1):
            h = self.headings[i]
            if h.line <= line and h.level < level:
                chain.append((h.line, bounds[i + 1] - 1))
                level = h.level
        first_heading = self.headings[0].line if self.headings else len(self.lines) + 1
        chain.append((1, first_heading - 1))  # the text before the first heading frames the whole doc
        return chain

    def text_of(self, first: int, last: int) -> str:
        return "\n".join(self.lines[first - 1:last])


_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_COMMENT = re.compile(r"^\s*<!--(.*?)-->\s*$")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]*)\)")
_TAG = re.compile(r"<[^>]+>")


def github_anchor(text: str) -> str:
    """The id GitHub gives a heading: its text without markup, lower case, every character but letters,
    digits, ``_``, ``-`` and spaces dropped, spaces as ``-`` (a repeated one gets ``-1``, ``-2``: parse())."""
    text = _LINK.sub(r"\1", text)
    text = _TAG.sub("", text).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def parse(path: Path, text: str | None = None) -> Doc:
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    try:
        rel = str(path.relative_to(ROOT))
    except ValueError:
        rel = path.name
    doc = Doc(path, rel, lines)
    seen: dict[str, int] = {}
    pending: list[Comment] = []  # comments since the last content, for the next code block
    i, blank_before = 0, True
    prose: list[tuple[int, str]] = []

    def flush() -> None:
        if prose:
            doc.paragraphs.extend(_paragraphs(rel, prose))
            prose.clear()

    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            flush()
            indent, mark, lang = len(fence.group(1)), fence.group(2), fence.group(3).lower()
            close = re.compile(rf"^\s*{re.escape(mark[0])}{{{len(mark)},}}\s*$")
            body, j = [], i + 1
            while j < len(lines) and not close.match(lines[j]):
                body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j].lstrip())
                j += 1
            doc.blocks.append(CodeBlock(rel, i + 1, i + 2, lang, tuple(body), tuple(pending)))
            pending, i, blank_before = [], j + 1, False
            continue
        if blank_before and (line.startswith("    ") or line.startswith("\t")) and line.strip():
            flush()
            body, j = [], i
            while j < len(lines) and (not lines[j].strip() or lines[j].startswith(("    ", "\t"))):
                body.append(lines[j][4:] if lines[j].startswith("    ") else lines[j][1:])
                j += 1
            while body and not body[-1].strip():
                body.pop()
            doc.blocks.append(CodeBlock(rel, i + 1, i + 1, "", tuple(body), tuple(pending)))
            pending, i, blank_before = [], i + len(body), False
            continue
        if not line.strip():
            flush()
            blank_before, i = True, i + 1
            continue
        blank_before = False
        comment = _COMMENT.match(line)
        heading = _HEADING.match(line)
        if comment:
            flush()
            doc.comments.append(Comment(i + 1, comment.group(1).strip()))
            pending.append(doc.comments[-1])
        elif heading:
            flush()
            base = github_anchor(heading.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            anchor = base if n == 0 else f"{base}-{n}"
            doc.headings.append(Heading(i + 1, len(heading.group(1)), heading.group(2), anchor))
            pending = []
        else:
            prose.append((i + 1, line))
            pending = []
        i += 1
    flush()
    return doc


def _paragraphs(rel: str, prose: list[tuple[int, str]]) -> Iterator[Paragraph]:
    """A run of prose lines as paragraphs: each table row alone, each list item from its marker on."""
    current: list[tuple[int, str]] = []

    def paragraph() -> Paragraph:
        row = current[0][1].lstrip().startswith("|")
        return Paragraph(rel, current[0][0], "\n".join(t for _, t in current), row)

    for number, line in prose:
        if current and (line.lstrip().startswith("|") or _LIST_ITEM.match(line) or paragraph().table_row):
            yield paragraph()
            current = []
        current.append((number, line))
    if current:
        yield paragraph()


def inline_code(p: Paragraph) -> Iterator[InlineCode]:
    """The code spans of a paragraph (CommonMark: a run of n backticks up to the next run of exactly n)."""
    text, i = p.text, 0
    while True:
        m = re.compile(r"(?<!\\)`+").search(text, i)
        if not m:
            return
        n = len(m.group(0))
        close = re.compile(rf"(?<!`)`{{{n}}}(?!`)").search(text, m.end())
        if not close:
            i = m.end()
            continue
        content = text[m.end():close.start()].replace("\n", " ")
        if content.startswith(" ") and content.endswith(" ") and content.strip():
            content = content[1:-1]
        if p.table_row:
            content = content.replace("\\|", "|")
        yield InlineCode(p, p.line + text.count("\n", 0, m.start()), content, m.start(), close.end())
        i = close.end()


def prose_text(p: Paragraph) -> str:
    """The paragraph with its code spans blanked out (same length, so offsets and lines hold)."""
    out = list(p.text)
    for span in inline_code(p):
        for k in range(span.start, span.end):
            if out[k] != "\n":
                out[k] = " "
    return "".join(out)


@functools.cache
def docs() -> tuple[Doc, ...]:
    return tuple(parse(path) for path in doc_paths())


# Shell text as commands.

_SEPARATORS = {"|", "||", "&&", ";", "&", "(", ")", ";;", "|&"}
_PROMPT = re.compile(r"^\s*\$\s")


def tokens(text: str) -> list[str] | None:
    """Shell words (quotes removed, comments dropped, ``|``, ``&&``, ``;`` as words of their own); None when the
    text is not complete shell (an unclosed quote)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:
        return None


def commands(words: list[str]) -> list[list[str]]:
    """``words`` cut at ``|``, ``&&``, ``;`` and the like: one list per simple command."""
    out: list[list[str]] = [[]]
    for word in words:
        if word in _SEPARATORS or (word and set(word) <= set(";&|()")):
            out.append([])
        else:
            out[-1].append(word)
    return [c for c in out if c]


@dataclass(frozen=True)
class ShellLine:
    line: int  # in the doc
    text: str  # the logical line: continuations joined, a console prompt removed
    words: list[str]


def shell_lines(block: CodeBlock) -> list[ShellLine]:
    """A block's logical command lines: backslash continuations and quotes left open joined to the next line.
    In a ``console`` block only the lines after a ``$`` prompt are commands (the rest is output)."""
    out: list[ShellLine] = []
    console = block.lang == "console"
    i = 0
    while i < len(block.lines):
        raw = block.lines[i]
        if console and not _PROMPT.match(raw):
            i += 1
            continue
        first, text = i, _PROMPT.sub("", raw) if console else raw
        words = tokens(text.rstrip("\\"))
        while i + 1 < len(block.lines) and (text.rstrip().endswith("\\") or words is None):
            i += 1
            text = (text.rstrip()[:-1] + " " if text.rstrip().endswith("\\") else text + "\n") + block.lines[i].strip()
            words = tokens(text.rstrip("\\"))
        if text.strip():
            out.append(ShellLine(block.first + first, text, words if words is not None else text.split()))
        i += 1
    return out


# Words that only run what follows them.
_WRAPPERS = {"sudo", "env", "exec", "nohup", "time", "command", "then", "do", "else", "!"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def command_start(command: list[str]) -> int:
    """The index of the program's word in a simple command: past ``VAR=value`` words and wrappers (``sudo``,
    ``env``, ``timeout 60``)."""
    k = 0
    while k < len(command):
        word = command[k]
        if _ASSIGNMENT.match(word) or word in _WRAPPERS:
            k += 1
        elif word == "timeout":
            k += 2
        else:
            return k
    return k
