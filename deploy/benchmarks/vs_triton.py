"""Conveyor and real Triton 2.51 side by side: the same model repository, the same perf_analyzer runs.

    python -m conveyor.deploy.benchmarks.vs_triton                        # 5 cases x c=1,4,16, 2 passes, 4 s windows
    python -m conveyor.deploy.benchmarks.vs_triton --seconds 2 --passes 1 --concurrency 1 4 --cases 1 3
    python -m conveyor.deploy.benchmarks.vs_triton --baseline ../old-checkout  # adds "baseline / Triton"
    python -m conveyor.deploy.benchmarks.vs_triton --backend onnx          # Conveyor serves ONNX models instead

One python-backend repository holds two models, each ``max_batch_size: 8``,
one CPU instance, no dynamic batching: ``simple`` (Triton's INT32 [16] add/sub)
and ``identity_fp32`` (FP32 [262144], 1 MiB, in = out). Both servers stay up
for the whole run on free loopback ports, and only one is under load at a time:
each (case, concurrency) is measured on every server back to back, the order
flipping on every pass so neither always runs first. The tables give the median
over passes.

Conveyor runs as ``<checkout>/.venv/bin/conveyor serve`` (2 workers, 1 HTTP +
1 gRPC ingress, client shm allowed), so ``--conveyor-checkout``/``--baseline``
can put an older commit beside the current one in the same run. Real Triton
runs through ``../shared/tools/real-triton`` (python backend only, so Triton
always serves the ``model.py`` files; ``--backend onnx`` changes Conveyor's
side only, to show no backend-specific shortcut).

CPU per request: the utime + stime of every process in each server's process
group (Conveyor: supervisor, router, workers, ingresses; Triton: tritonserver
and its python stubs) before and after a run, divided by the requests the
server's statistics extension counted in between.

Writes bench-results/vs_triton.{json,md}. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from conveyor.deploy.benchmarks.perf import ROOT, PerfAnalyzerFailed, cpu_seconds, perf_analyzer, run_one, wait_ready
from conveyor.deploy.example_repo import add_sub, identity
from conveyor.deploy.ports import free_ports
from conveyor.deploy.runtime.procs import actor_role, group_processes
from conveyor.shm.naming import group_segments

REAL_TRITON = ROOT.parent / "shared" / "tools" / "real-triton"
IDENTITY_ELEMENTS = 262144  # FP32: 1 MiB
INSTANCE = "instance_group [ { count: 1 kind: KIND_CPU } ]\n"


@dataclass(frozen=True)
class Case:
    key: str
    title: str
    model: str
    protocol: str
    shared_memory: str = "none"

    @property
    def output_bytes(self) -> int:
        return IDENTITY_ELEMENTS * 4 if self.shared_memory != "none" else 0


CASES = [
    Case("simple-http", "simple, HTTP binary", "simple", "http"),
    Case("simple-grpc", "simple, gRPC", "simple", "grpc"),
    Case("identity-http", "identity 1 MiB, HTTP binary", "identity_fp32", "http"),
    Case("identity-http-shm", "identity 1 MiB, HTTP + system shm", "identity_fp32", "http", "system"),
    Case("identity-grpc-shm", "identity 1 MiB, gRPC + system shm", "identity_fp32", "grpc", "system"),
    # Not in issue 14's table, so not run by default: ask for it by number or key.
    Case("identity-grpc", "identity 1 MiB, gRPC", "identity_fp32", "grpc"),
]
DEFAULT_CASES = CASES[:5]

# ---------------------------------------------------------------- the model repositories

SIMPLE_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", in0 + in1), pb_utils.Tensor("OUTPUT1", in0 - in1)]))
        return responses
'''
IDENTITY_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
'''
SIMPLE_CONFIG = '''
name: "simple"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
'''
IDENTITY_CONFIG = f'''
name: "identity_fp32"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {IDENTITY_ELEMENTS} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {IDENTITY_ELEMENTS} ] }} ]
'''


def python_repo(repo: Path) -> Path:
    for name, code, config in (("simple", SIMPLE_PY, SIMPLE_CONFIG), ("identity_fp32", IDENTITY_PY, IDENTITY_CONFIG)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code).lstrip())
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config).lstrip() + INSTANCE)
    return repo


def onnx_repo(repo: Path) -> Path:
    """The same two models as onnxruntime graphs (same names, tensors and configs)."""
    add_sub(str(repo), "simple", 8, INSTANCE)
    identity(str(repo), "identity_fp32", "FP32", 8, str(IDENTITY_ELEMENTS), INSTANCE)
    return repo


# ---------------------------------------------------------------- the servers

@dataclass
class Server:
    name: str  # "conveyor", "baseline", "triton"
    argv: list[str]
    http: int
    grpc: int
    log: Path
    group: str = ""  # Conveyor's --group: its /dev/shm names carry it
    proc: subprocess.Popen[bytes] | None = None
    roles: dict[int, str] = field(default_factory=dict)

    def start(self) -> None:
        with open(self.log, "ab") as log:  # appended to across restarts (--restart)
            # Its own session: the whole tree can be found (and killed) by process group.
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def ready(self, models: list[str], timeout: float) -> None:
        assert self.proc is not None
        try:
            wait_ready(f"127.0.0.1:{self.http}", timeout)
            for m in models:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/models/{m}/ready", timeout=5) as r:
                    if r.status != 200:
                        raise SystemExit(f"model {m} not ready")
        except (SystemExit, OSError) as e:
            raise SystemExit(f"{self.name} did not come up ({e}); the end of its log {self.log}:\n"
                             f"{self.log_tail()}") from None
        self.roles = {pid: self.role(pid, argv) for pid, argv in group_processes(self.proc.pid).items()}

    def role(self, pid: int, argv: list[str]) -> str:
        assert self.proc is not None
        if pid == self.proc.pid:
            return "supervisor" if self.group else "tritonserver"
        if self.group:
            return actor_role(argv)
        return "python-stub" if any("triton_python_backend_stub" in a for a in argv) else Path(argv[0]).name

    def cpu(self) -> dict[int, float]:
        """CPU seconds per process of the group, by pid (new processes included: a restarted actor counts)."""
        assert self.proc is not None
        pids = group_processes(self.proc.pid)
        for pid, argv in pids.items():
            self.roles.setdefault(pid, self.role(pid, argv))
        return {pid: cpu_seconds(pid) for pid in pids}

    def successes(self, model: str) -> int | None:
        """Requests completed so far, from the statistics extension (both servers have it)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/models/{model}/stats", timeout=5) as r:
                return int(json.load(r)["model_stats"][0]["inference_stats"]["success"]["count"])
        except (OSError, ValueError, KeyError, IndexError):
            return None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 90) -> list[str]:
        """SIGTERM to the leader (Conveyor's supervisor stops its actors in order and frees its shared
        memory), SIGKILL to whatever of the group is still there after ``timeout``. Returns problems."""
        problems: list[str] = []
        if self.proc is None:
            return problems
        pgid = self.proc.pid
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                problems.append(f"{self.name} still running {timeout:.0f} s after SIGTERM: killed")
        deadline = time.monotonic() + 10
        while (left := group_processes(pgid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left:
            problems.append(f"{self.name}: {len(left)} process(es) of its group outlived it: killed")
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        if self.group:
            for entry in group_segments(self.group):
                problems.append(f"{self.name} left /dev/shm/{entry}: removed")
                try:
                    os.unlink(f"/dev/shm/{entry}")
                except FileNotFoundError:
                    pass
        return problems


def conveyor_server(name: str, checkout: Path, repo: Path, workers: int, logs: Path) -> Server:
    binary = checkout / ".venv" / "bin" / "conveyor"
    if not binary.exists():
        raise SystemExit(f"no {binary}: make a venv in that checkout first (python -m venv .venv; "
                         ".venv/bin/pip install -e .)")
    http, grpc, metrics = free_ports(3)
    group = f"vst{os.getpid()}{name[0]}"
    argv = [str(binary), "serve", "--group", group, "--model-repository", str(repo),
            "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--http-port", str(http),
            "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--workers", str(workers),
            "--http-ingress", "1", "--grpc-ingress", "1", "--allow-client-shm", "true"]
    return Server(name, argv, http, grpc, logs / f"{name}.log", group=group)


def triton_server(tool: Path, cache: Path, repo: Path, logs: Path) -> Server:
    if not tool.exists():
        raise SystemExit(f"no {tool}: pass --real-triton PATH, or --no-triton")
    http, grpc, metrics = free_ports(3)
    argv = ["bash", str(tool), str(cache), f"--model-repository={repo}", "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1", f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
            "--allow-metrics=false"]
    return Server("triton", argv, http, grpc, logs / "triton.log")


# ---------------------------------------------------------------- one measurement

def measure(pa: Path, server: Server, case: Case, concurrency: int, seconds: int) -> dict[str, Any]:
    port = server.http if case.protocol == "http" else server.grpc
    cpu0, n0 = server.cpu(), server.successes(case.model)
    try:
        # perf_analyzer stops after at most 10 windows (its --max-trials); the margin covers start-up.
        figures: dict[str, Any] = dict(run_one(pa, f"127.0.0.1:{port}", case.protocol, case.model, concurrency,
                                               seconds, (), case.shared_memory, case.output_bytes,
                                               timeout=seconds * 12 + 60))
    except PerfAnalyzerFailed as e:
        print(f"  FAILED {server.name} {case.key} c={concurrency}: {e}", file=sys.stderr, flush=True)
        return {"error": str(e)[-4000:]}
    cpu1, n1 = server.cpu(), server.successes(case.model)
    if n0 is not None and n1 is not None and n1 > n0:
        by_role: dict[str, float] = {}
        for pid, t in cpu1.items():
            role = server.roles.get(pid, "?")
            by_role[role] = by_role.get(role, 0.0) + t - cpu0.get(pid, 0.0)
        figures["requests"] = n1 - n0
        figures["cpu_us_per_request"] = sum(by_role.values()) / (n1 - n0) * 1e6
        figures["cpu_us_per_request_by_role"] = {k: round(v / (n1 - n0) * 1e6, 1) for k, v in sorted(by_role.items())}
    return figures


# ---------------------------------------------------------------- the tables

def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(value: float | None, spec: str = ".0f", suffix: str = "") -> str:
    return "fail" if value is None else f"{value:{spec}}{suffix}"


def summarize(runs: list[dict[str, Any]], servers: list[str], cases: list[str],
              concurrency: list[int]) -> list[dict[str, Any]]:
    """One row per (case, concurrency): each server's median infer/s, p99 and CPU per request over its
    passes (failed passes left out; None where every pass failed), and each Conveyor's ratio to the
    reference (Triton, or without Triton the first Conveyor's ratio to the baseline)."""
    rows = []
    if "triton" in servers:
        pairs = [(s, "triton") for s in servers if s != "triton"]
    else:
        pairs = [("conveyor", "baseline")] if {"conveyor", "baseline"} <= set(servers) else []
    for case in cases:
        for c in concurrency:
            row: dict[str, Any] = {"case": case, "concurrency": c}
            for s in servers:
                mine = [r for r in runs if r["server"] == s and r["case"] == case and r["concurrency"] == c]
                row[s] = {"infer_per_sec": median_of(mine, "infer_per_sec"), "p99_us": median_of(mine, "p99_us"),
                          "cpu_us_per_request": median_of(mine, "cpu_us_per_request"),
                          "failures": sum(1 for r in mine if "error" in r), "passes": len(mine)}
            for a, b in pairs:
                row[f"{a}/{b}"] = ratio(row[a]["infer_per_sec"], row[b]["infer_per_sec"])
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], servers: list[str], header: list[str]) -> str:
    titles = {c.key: c.title for c in CASES}
    ratios = [k for k in rows[0] if "/" in k] if rows else []
    concurrency = sorted({r["concurrency"] for r in rows})
    out = [*header, ""]
    for key in ratios:
        out += [f"### infer/s, {key.replace('/', ' ÷ ')} (median of passes)", "",
                "| case | " + " | ".join(f"c={c}" for c in concurrency) + " |",
                "|---|" + "---|" * len(concurrency)]
        for case in dict.fromkeys(r["case"] for r in rows):
            cells = [fmt(r[key], ".2f", "x") for c in concurrency for r in rows if r["case"] == case
                     and r["concurrency"] == c]
            out.append(f"| {titles.get(case, case)} | " + " | ".join(cells) + " |")
        out.append("")
    out += ["### infer/s, p99 latency (ms) and CPU per request (µs, every process of the server), median of passes",
            "", "| case | c | " + "".join(f"{s} infer/s | {s} p99 | {s} CPU | " for s in servers)
            + "".join(f"{k.replace('/', ' ÷ ')} | " for k in ratios),
            "|---|---|" + "---|---|---|" * len(servers) + "---|" * len(ratios)]
    for r in rows:
        cells = []
        for s in servers:
            f = r[s]
            failed = f" ({f['failures']}/{f['passes']} failed)" if f["failures"] and f["infer_per_sec"] else ""
            p99 = None if f["p99_us"] is None else f["p99_us"] / 1000
            cpu = "-" if f["cpu_us_per_request"] is None else fmt(f["cpu_us_per_request"])  # no statistics read
            cells.append(f"{fmt(f['infer_per_sec'])}{failed} | {fmt(p99, '.2f')} | {cpu}")
        out.append(f"| {titles.get(r['case'], r['case'])} | {r['concurrency']} | " + "".join(f"{c} | " for c in cells)
                   + "".join(f"{fmt(r[k], '.2f', 'x')} | " for k in ratios))
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the run

def git_head(checkout: Path) -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(checkout), *a], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "?"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def pick_cases(chosen: list[str] | None) -> list[Case]:
    if not chosen:
        return DEFAULT_CASES
    by_key = {c.key: c for c in CASES} | {str(i): c for i, c in enumerate(CASES, 1)}
    unknown = [k for k in chosen if k not in by_key]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}: pick from 1-{len(CASES)} or {[c.key for c in CASES]}")
    return list(dict.fromkeys(by_key[k] for k in chosen))


def start_all(servers: list[Server]) -> None:
    for s in servers:
        s.start()
    for s in servers:
        # Triton's first start builds its venv (pip): give it time.
        s.ready(["simple", "identity_fp32"], timeout=600 if s.name == "triton" else 180)
        print(f"{s.name} ready on HTTP {s.http}, gRPC {s.grpc} ({' '.join(s.argv[:2])})", flush=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # KeyboardInterrupt, not SystemExit: PerfAnalyzerFailed is a SystemExit and is caught per run.
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cases", nargs="+",
                    help="numbers (1-6; 1-5 when omitted) or keys: " + ", ".join(c.key for c in CASES))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--restart", action="store_true",
                    help="start every server afresh before each pass: on a small VM a group's throughput at low "
                         "concurrency can differ by 15%% from one start to the next (docs/PERFORMANCE.md)")
    ap.add_argument("--seconds", type=int, default=4, help="perf_analyzer's measurement window")
    ap.add_argument("--backend", choices=["python", "onnx"], default="python", help="what Conveyor serves")
    ap.add_argument("--workers", type=int, default=2, help="Conveyor's workers")
    ap.add_argument("--conveyor-checkout", type=Path, action="append", default=[],
                    help="serve Conveyor from DIR/.venv/bin/conveyor (default: this checkout); a second one is "
                         "the baseline")
    ap.add_argument("--baseline", type=Path, help="another checkout, measured as a third server")
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument("--real-triton", type=Path, default=REAL_TRITON)
    ap.add_argument("--triton-cache", type=Path, default=ROOT / ".cache" / "triton")
    ap.add_argument("--perf-analyzer", type=Path, help="the perf_analyzer binary (default: installed in .cache)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = ap.parse_args()

    checkouts = [c.resolve() for c in args.conveyor_checkout] or [ROOT]
    if args.baseline:
        checkouts.append(args.baseline.resolve())
    if len(checkouts) > 2:
        raise SystemExit("at most two Conveyor checkouts: the measured one and a baseline")
    cases = pick_cases(args.cases)
    pa = args.perf_analyzer or perf_analyzer(ROOT / ".cache")
    signal.signal(signal.SIGTERM, _interrupt)

    work = Path(tempfile.mkdtemp(prefix="conveyor-vs-triton-"))
    py_repo = python_repo(work / "python")
    conveyor_repo = onnx_repo(work / "onnx") if args.backend == "onnx" else py_repo
    servers = [conveyor_server(name, c, conveyor_repo, args.workers, work)
               for name, c in zip(["conveyor", "baseline"], checkouts, strict=False)]
    if not args.no_triton:
        servers.append(triton_server(args.real_triton, args.triton_cache.resolve(), py_repo, work))
    names = [s.name for s in servers]
    started = datetime.datetime.now().astimezone()
    load0 = os.getloadavg()
    runs: list[dict[str, Any]] = []
    problems: list[str] = []
    try:
        start_all(servers)
        for p in range(args.passes):
            if p and args.restart:
                for s in servers:
                    problems += s.stop()
                start_all(servers)
            order = servers if p % 2 == 0 else servers[::-1]
            for case in cases:
                for c in args.concurrency:
                    for s in order:
                        r = {"pass": p, "server": s.name, "case": case.key, "concurrency": c,
                             **measure(pa, s, case, c, args.seconds)}
                        runs.append(r)
                        print(json.dumps({k: v for k, v in r.items() if k != "error"}), flush=True)
    except KeyboardInterrupt:
        problems.append("interrupted: the tables hold what was measured before")
        print("interrupted", file=sys.stderr)
    finally:
        for s in servers:
            problems += s.stop()
        for line in problems:
            print(f"warning: {line}", file=sys.stderr)

    if not runs:
        print("nothing measured: no result files written", file=sys.stderr)
        return 1
    rows = summarize(runs, names, [c.key for c in cases], args.concurrency)
    heads = {s.name: git_head(c) for s, c in zip(servers, checkouts, strict=False)}
    header = [
        ("# Conveyor vs real Triton 2.51" if "triton" in names else "# Conveyor without Triton")
        + " (benchmarks/vs_triton.py)", "",
        f"- date: {started.isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {cpu_model()}; load average {load0[0]:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end",
        *(f"- {name}: `{heads[name]}` ({c})" for name, c in zip(names, checkouts, strict=False)),
        f"- Conveyor serves the {args.backend} models ({args.workers} workers, 1 HTTP + 1 gRPC ingress)"
        + ("; Triton serves the python models" if "triton" in names else "")
        + " (1 CPU instance each, max_batch_size 8, no dynamic batching)",
        f"- perf_analyzer: {args.seconds} s windows, stability 100%, p99; {args.passes} pass(es), "
        "server order flipped every pass" + (", every server restarted before each" if args.restart else ""),
        *(f"- warning: {p}" for p in problems),
    ]
    md = markdown(rows, names, header)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vs_triton.json").write_text(json.dumps(
        {"date": started.isoformat(timespec="seconds"), "cpus": os.cpu_count(), "cpu_model": cpu_model(),
         "loadavg_start": load0, "loadavg_end": os.getloadavg(), "backend": args.backend, "workers": args.workers,
         "seconds": args.seconds, "passes": args.passes, "heads": heads, "checkouts": [str(c) for c in checkouts],
         "problems": problems, "runs": runs, "summary": rows}, indent=2))
    (args.out / "vs_triton.md").write_text(md)
    print(md)
    failed = sum(1 for r in runs if "error" in r)
    if failed:
        print(f"{failed} of {len(runs)} perf_analyzer runs failed (see 'error' in vs_triton.json)", file=sys.stderr)
    if failed or problems:
        print(f"server logs and repositories kept in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
