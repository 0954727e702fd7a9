"""The docs against a running group: the metrics they name are served, and their examples run.

The group is the one ``make serve`` starts: ``conveyor serve`` with the flags of the Makefile's ``serve`` recipe
and no ``--model-repository`` (so the example repository of deploy/example_repo.py), here on free loopback ports
and its own group name, with a smaller arena and no drain grace (how fast it stops, not what it serves).

Examples. A code block is an example when it is

* shell (a ``sh``, ``bash``, ``shell`` or ``console`` fence, an untyped fence, an indented block) holding ``curl``
  command lines (in a ``console`` block, the lines after a ``$`` prompt): each ``curl`` line runs with bash, in
  order, curl with ``--fail-with-body -sS --max-time 10`` added, and passes when curl exits 0 (so HTTP < 400;
  23, a ``| head`` that stopped reading, is no failure) and so does the whole line;
* ``python`` naming tritonclient (``httpclient``, ``grpcclient``) or ``openai``: it runs as a script with this
  venv's Python (TIMEOUT_S at most) and passes when it exits 0.

Before it runs, ``localhost`` / ``127.0.0.1`` / ``0.0.0.0`` with port 8000, 8001 or 8002 become the group's HTTP,
gRPC and metrics ports (the ports ``make serve`` listens on: test_make_serve_is_what_the_examples_assume). An
example aimed at any other host is not run: it is reported. Other ports are left as they are (nothing listens).

The marker: an example that needs what this group does not have (a GPU, vLLM, a cloud bucket, docker or helm,
a model outside the example repository, a file of the reader's) is marked in the doc with one HTML comment on
its own line just before the block (blank lines and other comments may come between)::

    <!-- not-run: REASON -->

where REASON, required, says what it needs ("needs a GPU", "needs a vLLM model"). A marked block is not run.
A marker that is not just before a code block, or has no reason, is an error.

Metrics. Every ``nv_*`` / ``conveyor_*`` name the docs write (``{a,b}`` expanded, ``*`` as a wildcard, label
names in ``name{label,label}`` checked too) is served on this group's ``/metrics`` after one request, unless
CONDITIONAL says when alone it is served: those are checked against their declaration in the code that renders
``/metrics`` (METRIC_MODULES). A ``conveyor_*`` name the code spells outside those modules (a request or
response parameter such as ``conveyor_host``) is no metric and passes.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conveyor.deploy.cli import build_parser
from conveyor.deploy.ports import free_ports
from tests.support import docs as md
from tests.support.group import Server, abandon, wait_ready
from tests.support.metrics import metrics_text
from tests.support.paths import ROOT

LEVEL = "e2e"

TIMEOUT_S = 60  # one example at most: a python snippet imports tritonclient (seconds on a busy 2-core host)
CURL_TIMEOUT_S = 10  # one curl line: every request of the examples answers in milliseconds
# curl as the examples run it: an HTTP status >= 400 fails it, its own exit status is kept (23, a reader such as
# `head` that stopped reading, is none of the server's doing).
CURL_WRAPPER = (f'curl() {{ command curl --fail-with-body -sS --max-time {CURL_TIMEOUT_S} "$@"; local rc=$?; '
                'case $rc in 0|23) ;; *) echo $rc >> "$CURL_STATUS";; esac; return $rc; }\n')
# The ports ``make serve`` listens on, which the examples use, by the role the group's port plays.
DOC_PORTS = {8000: "http", 8001: "grpc", 8002: "metrics"}
LOOPBACK = {"localhost", "127.0.0.1", "0.0.0.0", "[::1]", "::1"}
SHELL_LANGS = {"", "sh", "bash", "console", "shell", "zsh"}
PYTHON_LANGS = {"python", "py", "python3"}
MARKER = re.compile(r"^not-run:\s*(\S.*)$")

# The modules that write /metrics' families: a metric is declared when its name is a string there.
METRIC_MODULES = ("ingress/prometheus.py", "ingress/system_metrics.py", "router/observability/histograms.py",
                  "proto/metric_series.py")
GPU_METRICS = r"nv_gpu_\w+|nv_energy_consumption"  # served by the example group too, on a host with a GPU
# Metrics served only under a condition the example group does not meet (pattern: the condition).
CONDITIONAL = {
    r"nv_inference_\w+_summary_us|nv_cache_\w+_summary_per_model": "--metrics-config summary_latencies=true",
    r"nv_inference_first_response_histogram_ms": "a decoupled model (the example repository has none)",
    r"nv_cache_num_\w+_per_model|nv_cache_\w+_duration_per_model": "a response-cache model (as Triton)",
    GPU_METRICS: "a GPU, through NVML",
    r"conveyor_request_migrations_total": "a request moved after its worker died (vLLM)",
    r"conveyor_engine_prefix_evictions_total": "evictions reported by vLLM engines",
    r"conveyor_engine_session_placements_total": "requests that name a session, on a vLLM model of several engines",
    r"conveyor_adaptive_queue_delay_us": "adaptive batching (conveyor.latency_target_us)",
    r"conveyor_trace_spans_\w+_total": "--trace-config mode=opentelemetry",
}


def make_serve_flags() -> list[str]:
    """The flags the Makefile's ``serve`` recipe gives ``conveyor serve``."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^serve:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert recipe, "the Makefile has no serve target"
    for line in recipe.group(1).splitlines():
        words = shlex.split(line.strip())
        for k, word in enumerate(words[:-1]):
            if word.endswith("conveyor") and words[k + 1] == "serve":
                return words[k + 2:]
    raise AssertionError("the Makefile's serve recipe runs no `conveyor serve`")


def test_make_serve_is_what_the_examples_assume() -> None:
    """README: ``make serve`` serves the example repository on HTTP 8000, gRPC 8001, metrics 8002, client shared
    memory allowed; the examples are written for those ports."""
    args = build_parser().parse_args(["serve", *make_serve_flags()])
    assert (args.http_port, args.grpc_port, args.metrics_port) == tuple(DOC_PORTS), args
    assert not args.model_repository  # the example repository
    assert args.allow_client_shm


@pytest.fixture(scope="module")
def group() -> Iterator[Server]:
    http_port, grpc_port, metrics_port = free_ports(3)
    name = f"d{os.getpid()}"
    proc = subprocess.Popen([
        sys.executable, "-m", "conveyor.deploy.cli", "serve", *make_serve_flags(), "--group", name,
        "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
        "--arena-size", str(64 << 20), "--exit-timeout-secs", "10", "--drain-grace-secs", "0",
    ])
    try:
        wait_ready(http_port, proc, (grpc_port, metrics_port))
    except Exception:
        abandon(proc)
        raise
    srv = Server(proc, name, http_port, grpc_port, metrics_port,
                 os.path.join(tempfile.gettempdir(), f"conveyor-{name}-example-models"))
    yield srv
    assert srv.stop() == 0
    assert srv.shm_segments() == [], "shared memory left behind after shutdown"


# Examples.

@dataclass(frozen=True)
class Example:
    block: md.CodeBlock
    kind: str  # "curl" or "python"
    skip: str | None  # the not-run marker's reason


def not_run(block: md.CodeBlock) -> str | None:
    reasons = [m.group(1) for c in block.comments if (m := MARKER.match(c.text))]
    return reasons[0] if reasons else None


def curl_lines(block: md.CodeBlock) -> list[md.ShellLine]:
    out = []
    for line in md.shell_lines(block):
        for command in md.commands(line.words):
            k = md.command_start(command)
            if k < len(command) and Path(command[k]).name == "curl":
                out.append(line)
                break
    return out


def examples(docs: tuple[md.Doc, ...]) -> list[Example]:
    out = []
    for doc in docs:
        for block in doc.blocks:
            if block.lang in SHELL_LANGS and curl_lines(block):
                out.append(Example(block, "curl", not_run(block)))
            elif block.lang in PYTHON_LANGS and re.search(r"\b(tritonclient|httpclient|grpcclient|openai)\b",
                                                           block.text):
                out.append(Example(block, "python", not_run(block)))
    return out


def marker_problems(doc: md.Doc) -> list[str]:
    attached = {c.line for block in doc.blocks for c in block.comments}
    problems = []
    for c in doc.comments:
        if not c.text.startswith("not-run"):
            continue
        if not MARKER.match(c.text):
            problems.append(f"{doc.rel}:{c.line}: `<!-- {c.text} -->`: a marker is `<!-- not-run: REASON -->`")
        elif c.line not in attached:
            problems.append(f"{doc.rel}:{c.line}: `<!-- {c.text} -->` is not just before a code block")
    return problems


def rewrite(text: str, srv: Server) -> str:
    """The doc's ports (8000, 8001, 8002 on a loopback name) as the group's, on 127.0.0.1."""
    ports = {"http": srv.http_port, "grpc": srv.grpc_port, "metrics": srv.metrics_port}
    return re.sub(r"(?<![\w.-])(?:localhost|127\.0\.0\.1|0\.0\.0\.0):(800[012])(?!\d)",
                  lambda m: f"127.0.0.1:{ports[DOC_PORTS[int(m.group(1))]]}", text)


_URL_HOST = re.compile(r"\bhttps?://(\[[\w:]+\]|[\w.-]+)")
_HOST_PORT = re.compile(r"(?:^|(?<=[\s\"'=(]))(\[[\w:]+\]|[A-Za-z][\w.-]*):\d{2,5}(?=[/\s\"')]|$)")


def foreign_hosts(text: str) -> list[str]:
    """The hosts other than this one that ``text`` addresses."""
    hosts = _URL_HOST.findall(text) + _HOST_PORT.findall(text)
    return sorted({h for h in hosts if h not in LOOPBACK})


def _tail(text: bytes | str | None, n: int = 400) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text = (text or "").strip()
    return ("..." + text[-n:] if len(text) > n else text).replace("\n", " | ")


def run_example(ex: Example, srv: Server, workdir: Path) -> list[str]:
    """Why the example failed, one line each; [] when it passed."""
    where = f"{ex.block.where} ({ex.kind})"
    if ex.kind == "curl":
        problems = []
        for line in curl_lines(ex.block):
            at = f"{ex.block.doc}:{line.line} (curl)"
            hosts = foreign_hosts(line.text)
            if hosts:
                problems.append(f"{at}: not run: it addresses {', '.join(hosts)}, not this host")
                continue
            status = workdir / "curl-status"
            status.unlink(missing_ok=True)
            try:
                done = subprocess.run(["bash", "-c", CURL_WRAPPER + rewrite(line.text, srv)], cwd=workdir,
                                      capture_output=True, timeout=CURL_TIMEOUT_S + 5, check=False,
                                      env={**os.environ, "CURL_STATUS": str(status)})
            except subprocess.TimeoutExpired:
                problems.append(f"{at}: no answer in {CURL_TIMEOUT_S + 5} s: {line.text.strip()[:120]}")
                continue
            codes = status.read_text().split() if status.exists() else []
            if codes or done.returncode != 0:
                why = f"curl exited {', '.join(codes)} (22: HTTP >= 400; 7: nothing listens)" if codes else \
                    f"the command exited {done.returncode}"
                problems.append(f"{at}: {why}: {line.text.strip()[:120]} -> {_tail(done.stdout + done.stderr)}")
        return problems
    hosts = foreign_hosts(ex.block.text)
    if hosts:
        return [f"{where}: not run: it addresses {', '.join(hosts)}, not this host"]
    script = workdir / f"example_{Path(ex.block.doc).stem}_{ex.block.line}.py"
    script.write_text(rewrite(ex.block.text, srv) + "\n", encoding="utf-8")
    try:
        done = subprocess.run([sys.executable, str(script)], cwd=workdir, capture_output=True, timeout=TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        return [f"{where}: did not end in {TIMEOUT_S} s"]
    if done.returncode != 0:
        last = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()[-1:]  # the exception
        return [f"{where}: exited {done.returncode}: {_tail(' '.join(last))}"]
    return []


def test_the_docs_examples_run(group: Server, tmp_path: Path) -> None:
    docs = md.docs()
    problems = [p for doc in docs for p in marker_problems(doc)]
    found = examples(docs)
    ran = [ex for ex in found if ex.skip is None]
    for ex in ran:
        problems += run_example(ex, group, tmp_path)
    assert found, "no examples found in the docs: the parsing is broken"
    assert not problems, (
        f"{len(problems)} problems in the {len(ran)} examples run ({len(found) - len(ran)} marked not-run); "
        "fix the example, or mark it `<!-- not-run: REASON -->` where it needs more than the example "
        "repository's group:\n" + "\n".join(problems))


def test_the_example_checks_fail_what_fails(group: Server, tmp_path: Path) -> None:
    """A passing check that cannot fail proves nothing: a made-up doc's good and bad examples."""
    doc = md.parse(ROOT / "docs" / "EXAMPLE.md", "\n".join([
        "# T", "",
        "    curl -s localhost:8000/v2/models/simple", "",
        "```sh", "curl -s localhost:8000/v2/models/no_such_model", "```", "",
        "```console", "$ curl -s localhost:8002/metrics | head -1", "# HELP ...", "```", "",
        "<!-- not-run: needs a GPU -->", "", "```python", "import tritonclient.http", "raise SystemExit(3)", "```", "",
        "```python", "import tritonclient.http as h",
        "assert h.InferenceServerClient('localhost:8000').is_server_live()", "```", "",
        "```python", "import tritonclient.http as h", "h.InferenceServerClient('elsewhere.example:8000')", "```", "",
        "<!-- not-run -->", "",
        "text", "", "<!-- not-run: no block follows -->", "", "more text",
    ]))
    found = examples((doc,))
    assert [(ex.kind, ex.skip) for ex in found] == [("curl", None), ("curl", None), ("curl", None),
                                                    ("python", "needs a GPU"), ("python", None), ("python", None)]
    results = [run_example(ex, group, tmp_path) for ex in found if ex.skip is None]
    assert [bool(r) for r in results] == [False, True, False, False, True], results
    assert "curl exited 22" in results[1][0]
    assert "elsewhere.example" in results[4][0]
    assert [p.split(":", 2)[2].strip() for p in marker_problems(doc)] == [
        "`<!-- not-run -->`: a marker is `<!-- not-run: REASON -->`",
        "`<!-- not-run: no block follows -->` is not just before a code block"]


# Metrics.

@dataclass(frozen=True)
class MetricMention:
    doc: str
    line: int
    name: str  # as written, braces expanded: may hold * (a wildcard)
    labels: tuple[str, ...]  # the bare label names written after it ({model,version}), if any


_METRIC = re.compile(r"(?<![\w.$/-])((?:nv|conveyor)_(?:[a-z0-9_*]|(?<=_)\{[a-z0-9_]+(?:,[a-z0-9_]+)+\})*)"
                     r"(\{[^{}\n]*\})?")


def _expand(name: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [x for word in m.group(1).split(",") for x in _expand(name[:m.start()] + word + name[m.end():])]


def metric_mentions(doc: md.Doc) -> list[MetricMention]:
    out = []
    for n, line in enumerate(doc.lines, 1):
        for m in _METRIC.finditer(line):
            raw_labels = (m.group(2) or "{}")[1:-1]
            labels = tuple(x.strip() for x in raw_labels.split(",")) if raw_labels else ()
            if not all(re.fullmatch(r"[a-z_][a-z0-9_]*", x) for x in labels):
                labels = ()  # a PromQL matcher or a template: the labels are not names here
            out += [MetricMention(doc.rel, n, name, labels) for name in _expand(m.group(1))]
    return out


@functools.cache
def declared_metrics() -> frozenset[str]:
    names: set[str] = set()
    for rel in METRIC_MODULES:
        for node in ast.walk(ast.parse((ROOT / rel).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for m in re.finditer(r"(?:^|# (?:HELP|TYPE) )((?:nv|conveyor)_[a-z0-9_]+)", node.value):
                    names.add(m.group(1))
    return frozenset(names)


@functools.cache
def code_names() -> frozenset[str]:
    """``conveyor_*`` strings of the code outside METRIC_MODULES: parameter names and the like, no metrics."""
    names: set[str] = set()
    for folder in ("ingress", "router", "workers", "proto", "shm"):
        for path in (ROOT / folder).rglob("*.py"):
            if str(path.relative_to(ROOT)) not in METRIC_MODULES:
                names.update(re.findall(r"[\"'](conveyor_[a-z0-9_]+)[\"']", path.read_text(encoding="utf-8")))
    return frozenset(names)


def served(text: str) -> dict[str, set[str]]:
    """The families of a /metrics text, each with the label names its samples carry."""
    kinds = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    families: dict[str, set[str]] = {name: set() for name in kinds}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? ", line)
        if not m:
            continue
        name = m.group(1)
        if name not in families:
            name = re.sub(r"_(bucket|count|sum)$", "", name)
        families.setdefault(name, set()).update(re.findall(r"(\w+)=\"", m.group(2) or ""))
    return families


def metric_problem(m: MetricMention, live: dict[str, set[str]]) -> str | None:
    where = f"{m.doc}:{m.line}: `{m.name}`"
    base = m.name
    matches = [f for f in live if fnmatch.fnmatchcase(f, base)]
    if not matches:  # a histogram's or summary's series: its family
        base = re.sub(r"_(bucket|count|sum)$", "", m.name)
        matches = [f for f in live if fnmatch.fnmatchcase(f, base)]
    if matches:
        have = set().union(*(live[f] for f in matches))
        missing = [x for x in m.labels if x not in have]
        return f"{where}: no label {', '.join(missing)} on /metrics (it has {sorted(have)})" if missing else None
    condition = next((c for pattern, c in CONDITIONAL.items() if re.fullmatch(pattern, base.replace("*", "x"))), None)
    if condition is not None:
        if any(fnmatch.fnmatchcase(d, base) for d in declared_metrics()):
            return None
        return f"{where}: served only with {condition}, but {', '.join(METRIC_MODULES)} declare no such metric"
    if base in code_names():
        return None  # a parameter's name (conveyor_host), not a metric
    return (f"{where}: not on /metrics of the example group, and not one of CONDITIONAL's "
            f"(declared in the code: {any(fnmatch.fnmatchcase(d, base) for d in declared_metrics())})")


def _infer_once(srv: Server) -> None:
    body = json.dumps({"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                                  for n in ("INPUT0", "INPUT1")]}).encode()
    url = f"http://{srv.http_url}/v2/models/simple/infer"
    with urllib.request.urlopen(urllib.request.Request(url, body), timeout=10) as r:
        assert r.status == 200


def test_every_metric_a_doc_names_is_served(group: Server) -> None:
    _infer_once(group)
    live = served(metrics_text(group))
    mentions = [m for doc in md.docs() for m in metric_mentions(doc)]
    assert len(mentions) > 20, "the docs' metrics were not found: the parsing is broken"
    problems = [p for m in mentions if (p := metric_problem(m, live)) is not None]
    # CONDITIONAL stays true: each entry is a metric the code declares and the example group does not serve.
    for pattern, condition in CONDITIONAL.items():
        names = [d for d in declared_metrics() if re.fullmatch(pattern, d)]
        if not names:
            problems.append(f"CONDITIONAL: `{pattern}` ({condition}) matches no metric the code declares")
        problems += [f"CONDITIONAL: `{d}` is served by the example group: not conditional" for d in names
                     if d in live and not re.fullmatch(GPU_METRICS, d)]
    assert not problems, f"{len(problems)} metric names in the docs that are not served:\n" + "\n".join(problems)


def test_the_metric_checks_see_names_and_labels() -> None:
    doc = md.parse(ROOT / "docs" / "EXAMPLE.md", "\n".join([
        "`nv_gpu_memory_{total,used}_bytes`, `conveyor_waiting_requests{model,version}`, `nv_inference_*`,",
        "`sum(rate(nv_inference_count{namespace!=\"\"}[1m]))`, env_var, `conveyor_host`.",
    ]))
    got = [(m.name, m.labels) for m in metric_mentions(doc)]
    assert got == [("nv_gpu_memory_total_bytes", ()), ("nv_gpu_memory_used_bytes", ()),
                   ("conveyor_waiting_requests", ("model", "version")), ("nv_inference_*", ()),
                   ("nv_inference_count", ()), ("conveyor_host", ())], got
    live = {"nv_inference_count": {"model", "version"}}
    assert metric_problem(MetricMention("d", 1, "nv_inference_count", ("model",)), live) is None
    assert metric_problem(MetricMention("d", 1, "nv_inference_count", ("pod",)), live)
    assert metric_problem(MetricMention("d", 1, "nv_no_such_metric", ()), live)
    assert metric_problem(MetricMention("d", 1, "conveyor_host", ()), live) is None
    assert metric_problem(MetricMention("d", 1, "nv_gpu_utilization", ()), live) is None
