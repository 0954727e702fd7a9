"""benchmarks/llm_openai.py's use of aiperf without aiperf or a server: the command lines it builds,
what it reads from aiperf's export, its tables, and the CPU window (no process runs here)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from conveyor.deploy.benchmarks import aiperf_cli
from conveyor.deploy.benchmarks.llm_openai import (
    PROMPTS,
    STRUCTURED,
    Bench,
    CpuSampler,
    Run,
    Server,
    _cases,
    aiperf_arguments,
    markdown,
    write_prompts,
)

LEVEL = "unit"

# The parts of a profile_export_aiperf.json (schema 1.4, aiperf 0.13.0) that the benchmark reads.
EXPORT: dict[str, object] = {
    "output_token_throughput": {"unit": "tokens/sec", "avg": 448.84},
    "request_throughput": {"unit": "requests/sec", "avg": 7.013},
    "time_to_first_token": {"unit": "ms", "avg": 50.0, "p50": 41.12, "p99": 210.2},
    "inter_token_latency": {"unit": "ms", "avg": 7.0, "p50": 6.654},
    "http_req_chunks_received": {"unit": "count", "avg": 45.83},
    "request_count": {"unit": "requests", "avg": 38.0},
    "error_request_count": {"unit": "requests", "avg": 2.0},
    "total_output_tokens": {"unit": "tokens", "avg": 2432.0},
    "error_summary": [{"error_details": {"type": "X", "message": "boom"}, "count": 2}],
    "start_time": "2026-11-28T12:31:00.500000",
    "end_time": "2026-11-28T12:31:05.500000",
}


def test_the_summary_of_an_export() -> None:
    found = aiperf_cli.summary(EXPORT)
    assert (found.tokens_per_s, found.requests_per_s, found.ttft_ms_p50, found.ttft_ms_p99, found.itl_ms_p50,
            found.chunks_per_request, found.requests, found.errors, found.output_tokens, found.error) == (
        448.8, 7.01, 41.1, 210.2, 6.65, 45.8, 38, 2, 2432.0, "boom")
    assert found.end - found.start == pytest.approx(5.0)
    quiet = aiperf_cli.summary({k: v for k, v in EXPORT.items() if k not in ("error_request_count", "error_summary")})
    assert (quiet.errors, quiet.error) == (0, "")


def test_a_run_without_an_export_says_why(tmp_path: Path) -> None:
    (tmp_path / "profile_export.jsonl").write_text(
        json.dumps({"metrics": {}}) + "\n" + json.dumps({"error": {"code": 404, "message": "Not Found"}}) + "\n")
    assert aiperf_cli.first_record_error(tmp_path) == "404 Not Found"
    log = tmp_path / "aiperf.log"
    log.write_text("12:00 INFO fine\n╭─ Error Running AIPerf System ─╮\n│ 1 validation error │\n│  bad flag  │\n"
                   "╰──╯\n")
    assert aiperf_cli._log_tail(log) == "1 validation error bad flag"


def test_offline_environment() -> None:
    env = aiperf_cli.environment()
    assert "HF_HUB_OFFLINE" not in env and env["HF_ENDPOINT"].startswith("http://127.0.0.1:")


def bench(tmp_path: Path, clients: list[int]) -> Bench:
    args = argparse.Namespace(clients=clients, seconds=5.0, requests=8, tokens=64, aiperf_workers=1, cases=[])
    return Bench(Path("aiperf"), tmp_path / "tok", write_prompts(tmp_path / "p.jsonl", 3), tmp_path / "art", args)


def test_cases_and_their_command_lines(tmp_path: Path) -> None:
    b = bench(tmp_path, [1, 4])
    lines = [json.loads(line)["text"] for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert lines == PROMPTS * 3
    server = Server("conveyor", 1234, None, ["m", "m_lora_a", "m_lora_b"])  # type: ignore[arg-type]
    cases = {case.name: case for case in _cases(b.args)}
    assert list(cases) == ["sequential", "c=1", "c=4", "completions c=4", "mixed c=4", "json_schema c=1",
                           "json_schema c=4"]

    def flag(argv: list[str], name: str) -> str:
        return argv[argv.index(name) + 1]

    seq = aiperf_arguments(b, server, cases["sequential"])
    assert flag(seq, "--request-count") == "8" and "--benchmark-duration" not in seq
    assert flag(seq, "--model-names") == "m" and flag(seq, "--url") == "http://127.0.0.1:1234"
    assert json.loads(flag(seq, "--extra-inputs")) == {"ignore_eos": True, "min_tokens": 64, "temperature": 0}
    assert "--per-chunk-usage" in seq and "--use-server-token-count" in seq
    mixed = aiperf_arguments(b, server, cases["mixed c=4"])
    assert flag(mixed, "--model-names") == "m,m_lora_a,m_lora_b" and flag(mixed, "--concurrency") == "4"
    assert flag(mixed, "--benchmark-duration") == "5.0"
    completions = aiperf_arguments(b, server, cases["completions c=4"])
    assert flag(completions, "--endpoint-type") == "completions"
    assert "--per-chunk-usage" not in completions  # aiperf 0.13.0 refuses it there
    # Structured outputs: the schema, greedy, and no ignore_eos (past the schema's end only the end token is allowed).
    structured = json.loads(flag(aiperf_arguments(b, server, cases["json_schema c=4"]), "--extra-inputs"))
    assert structured == {"temperature": 0, "response_format": STRUCTURED}
    b.args.cases = ["json"]
    assert [case.name for case in _cases(b.args)] == ["json_schema c=1", "json_schema c=4"]


def test_ratios_per_round_and_medians() -> None:
    runs = [Run("conveyor", "c=4", 4, 10, 300.0, 40.0, 200.0, round=0, chunks_per_request=60.0),
            Run("vllm", "c=4", 4, 10, 200.0, 300.0, 900.0, round=0, chunks_per_request=7.0),
            Run("conveyor", "c=4", 4, 10, 500.0, 40.0, 200.0, round=1, chunks_per_request=62.0),
            Run("vllm", "c=4", 4, 10, 250.0, 300.0, 900.0, round=1, chunks_per_request=9.0,
                cpu_us_per_token={"VLLM::Worker": 100.0, "vllm-api": 50.0}, client_cpu_us_per_token=40.0)]
    md = markdown(runs)
    assert "| c=4 | 400 | 225 | 1.78 | 1.50, 2.00 |" in md
    assert "| 61.0 / 8.0 |" in md
    assert "| c=4 | - | 50 | - | 100 | - | 40 |" in md


def test_the_cpu_window_takes_the_samples_around_aiperfs_window() -> None:
    sampler = CpuSampler(None, 0)  # type: ignore[arg-type]
    sampler.samples = [(0.0, {1: ("worker", 1.0)}, {9: 1.0}), (1.0, {1: ("worker", 2.0)}, {9: 2.0}),
                       (2.0, {1: ("worker", 4.0), 2: ("router", 1.0)}, {9: 3.0}),
                       (3.0, {1: ("worker", 8.0), 2: ("router", 2.0)}, {9: 5.0})]
    per_token, client = sampler.window(1.5, 2.5, tokens=1000)  # from the sample at 1.0 to the one at 3.0
    assert per_token == {"router": 2000.0, "worker": 6000.0} and client == 3000.0
