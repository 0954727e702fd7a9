"""NVIDIA's aiperf (the successor of GenAI-Perf), the LLM load generator, in a venv of its own.

    python -m conveyor.deploy.benchmarks.aiperf_cli   # install it (when missing) and print its path

aiperf pins versions the project's venv cannot take (pyzmq, psutil, ...), so it goes into
``.cache/aiperf/venv`` on first use, a pinned release from the package index, as perf.py puts
perf_analyzer into ``.cache/perf_analyzer``; the benchmarks run its ``aiperf profile`` command and
read its JSON export (``profile_export_aiperf.json``).

Offline: aiperf loads its tokenizer with ``transformers`` from the folder given as ``--tokenizer``.
``HF_HUB_OFFLINE=1`` cannot be used with a folder in aiperf 0.13.0: offline, it looks the name up
with ``snapshot_download(local_files_only=True)``, which refuses a path as a repository id. Online,
an absolute path is taken as local and never looked up (``resolve_alias``), and transformers reads
the folder. So the environment here leaves offline mode off and points the hub at a closed local
port (``HF_ENDPOINT``): a lookup that happened anyway would fail at once instead of going out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout (this file is deploy/benchmarks/aiperf_cli.py)
VERSION = "0.13.0"
EXPORT = "profile_export_aiperf.json"


def aiperf(cache: Path = ROOT / ".cache") -> Path:
    """The ``aiperf`` command of ``cache/aiperf/venv``, installed there first when missing or of
    another version (the venv is made afresh then)."""
    home = cache / "aiperf"
    binary, stamp = home / "venv" / "bin" / "aiperf", home / "installed"
    if binary.exists() and stamp.exists() and stamp.read_text().strip() == VERSION:
        return binary
    shutil.rmtree(home / "venv", ignore_errors=True)
    stamp.unlink(missing_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)  # not the project venv's interpreter
    print(f"installing aiperf {VERSION} into {home / 'venv'} (once, a few minutes)", flush=True)
    subprocess.run([base, "-m", "venv", str(home / "venv")], check=True)
    subprocess.run([str(home / "venv" / "bin" / "pip"), "install", "-q", f"aiperf=={VERSION}"], check=True)
    stamp.write_text(VERSION + "\n")
    return binary


def environment() -> dict[str, str]:
    """aiperf's environment: no hub access (see the module's docstring), no telemetry."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return {**env, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_TELEMETRY": "1", "NO_COLOR": "1"}


def base_arguments(url: str, tokenizer: Path, workers: int = 1) -> list[str]:
    """What every run here passes: the server, the tokenizer folder, a quiet client that neither
    scrapes ``/metrics`` nor looks for GPUs, and one worker process (the client shares the host)."""
    return ["--url", url, "--tokenizer", str(tokenizer), "--ui-type", "none", "--workers-max", str(workers),
            "--record-processors", "1", "--no-server-metrics", "--no-gpu-telemetry"]


@dataclass
class Summary:
    """The figures the benchmarks take from one run's JSON export."""

    tokens_per_s: float
    requests_per_s: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    itl_ms_p50: float
    chunks_per_request: float  # chunks received per request (avg): below the tokens, the server bundled
    requests: int
    errors: int
    output_tokens: float
    start: float  # epoch seconds: the profiling phase's first request
    end: float  # epoch seconds: its last response
    error: str = ""  # the first error's message, when there were errors


def _stat(doc: dict[str, object], tag: str, stat: str = "avg") -> float:
    value = doc.get(tag)
    return float(value.get(stat) or 0.0) if isinstance(value, dict) else 0.0


def summary(doc: dict[str, object]) -> Summary:
    errors = doc.get("error_summary") or []
    first = ""
    if isinstance(errors, list) and errors:
        first = str(errors[0].get("error_details", {}).get("message", ""))
    return Summary(
        round(_stat(doc, "output_token_throughput"), 1), round(_stat(doc, "request_throughput"), 2),
        round(_stat(doc, "time_to_first_token", "p50"), 1), round(_stat(doc, "time_to_first_token", "p99"), 1),
        round(_stat(doc, "inter_token_latency", "p50"), 2), round(_stat(doc, "http_req_chunks_received"), 1),
        int(_stat(doc, "request_count")),
        int(_stat(doc, "error_request_count")), _stat(doc, "total_output_tokens"),
        datetime.fromisoformat(str(doc["start_time"])).timestamp(),
        datetime.fromisoformat(str(doc["end_time"])).timestamp(), first)


def first_record_error(artifacts: Path) -> str:
    """The error of the first failed request in ``profile_export.jsonl`` ('' when none): where
    aiperf writes no summary because every request failed."""
    records = artifacts / "profile_export.jsonl"
    if not records.exists():
        return ""
    with records.open() as f:
        for line in f:
            error = json.loads(line).get("error")
            if error:
                return f"{error.get('code', '')} {error.get('message', '')}".strip()
    return ""


class AiperfFailed(RuntimeError):
    """aiperf wrote no summary: every request failed, or aiperf itself did."""


def start(binary: Path, arguments: list[str], artifacts: Path) -> subprocess.Popen[bytes]:
    """``aiperf profile`` with its own session (so that its processes can be told apart), its
    output into ``artifacts/aiperf.log``."""
    artifacts.mkdir(parents=True, exist_ok=True)
    with (artifacts / "aiperf.log").open("wb") as log:
        return subprocess.Popen([str(binary), "profile", *arguments, "--artifact-dir", str(artifacts)],
                                stdout=log, stderr=subprocess.STDOUT, env=environment(), start_new_session=True)


def finish(proc: subprocess.Popen[bytes], artifacts: Path, timeout: float) -> Summary:
    """Wait for a run of ``start`` and read its export; ``AiperfFailed`` when there is none."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
    export = artifacts / EXPORT
    if not export.exists():
        reason = first_record_error(artifacts) or _log_tail(artifacts / "aiperf.log")
        raise AiperfFailed(f"no results (aiperf exited with {proc.returncode}): {reason}")
    return summary(json.loads(export.read_text()))


def run(binary: Path, arguments: list[str], artifacts: Path, timeout: float) -> Summary:
    return finish(start(binary, arguments, artifacts), artifacts, timeout)


def _log_tail(log: Path, lines: int = 5) -> str:
    """The last error box aiperf drew (``╭─ ... Error ...``), as one line; else its last ERROR lines."""
    if not log.exists():
        return "no log"
    text = log.read_text(errors="replace").splitlines()
    boxes = [i for i, line in enumerate(text) if line.startswith("╭─") and "Error" in line]
    if boxes:
        body = []
        for line in text[boxes[-1] + 1:]:
            if not line.startswith("│"):
                break
            body.append(line.strip("│ "))
        return " ".join(part for part in body if part)
    errors = [line.strip() for line in text if "ERROR" in line]
    return " | ".join(errors[-lines:]) or "see " + str(log)


def wait_gone(pgid: int, timeout: float = 10) -> None:
    """Until no process of aiperf's session is left (its services exit after the main one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, 9)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    print(aiperf())
