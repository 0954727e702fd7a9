"""The tables of benchmarks/vs_triton.py: medians over passes, failures, ratios (no server runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.deploy.benchmarks.vs_triton import CASES, markdown, onnx_repo, pick_cases, python_repo, summarize

LEVEL = "unit"


def run(server: str, infer: float | None, case: str = "simple-http", c: int = 1, cpu: float = 100.0) -> dict:
    if infer is None:
        return {"server": server, "case": case, "concurrency": c, "error": "perf_analyzer failed (99)"}
    return {"server": server, "case": case, "concurrency": c, "infer_per_sec": infer, "p99_us": 2000.0,
            "cpu_us_per_request": cpu}


def test_medians_ratios_and_failures() -> None:
    runs = [run("conveyor", 100), run("conveyor", 300), run("conveyor", 200), run("conveyor", None),
            run("triton", 400), run("triton", 400), run("baseline", 100),
            run("conveyor", 50, c=4), run("triton", None, c=4)]
    rows = summarize(runs, ["conveyor", "baseline", "triton"], ["simple-http"], [1, 4])
    one, four = rows
    assert one["conveyor"]["infer_per_sec"] == 200 and one["conveyor"]["failures"] == 1
    assert one["conveyor/triton"] == pytest.approx(0.5) and one["baseline/triton"] == pytest.approx(0.25)
    assert four["triton"]["infer_per_sec"] is None and four["conveyor/triton"] is None  # every pass failed
    md = markdown(rows, ["conveyor", "baseline", "triton"], ["# title"])
    assert "| simple, HTTP binary | 0.50x | fail |" in md
    assert "| simple, HTTP binary | 1 | 200 (1/4 failed) | 2.00 | 100 |" in md  # infer/s, p99 ms, CPU µs
    assert "| simple, HTTP binary | 4 | 50 | 2.00 | 100 | fail | fail | - |" in md  # no pass of the baseline there


def test_without_triton_the_baseline_is_the_reference() -> None:
    rows = summarize([run("conveyor", 300), run("baseline", 200)], ["conveyor", "baseline"], ["simple-http"], [1])
    assert rows[0]["conveyor/baseline"] == pytest.approx(1.5)
    assert not [k for k in rows[0] if k.endswith("/triton")]


def test_cases_by_number_or_key() -> None:
    assert [c.key for c in pick_cases(["1", "identity-grpc-shm", "1"])] == ["simple-http", "identity-grpc-shm"]
    assert [c.key for c in pick_cases(None)] == [c.key for c in CASES[:5]]  # issue 14's table
    assert [c.key for c in pick_cases(["6"])] == ["identity-grpc"]  # asked for only
    with pytest.raises(SystemExit):
        pick_cases(["7"])


def test_both_repositories_hold_the_two_models(tmp_path: Path) -> None:
    for repo in (python_repo(tmp_path / "py"), onnx_repo(tmp_path / "onnx")):
        for model in ("simple", "identity_fp32"):
            config = (repo / model / "config.pbtxt").read_text()
            assert "max_batch_size: 8" in config and "kind: KIND_CPU" in config and "dynamic_batching" not in config
    assert (tmp_path / "onnx" / "identity_fp32" / "1" / "model.onnx").exists()
