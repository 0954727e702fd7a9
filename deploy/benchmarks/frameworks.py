"""The framework backends (fil, openvino, tensorflow): what Conveyor adds to a request, and what
dynamic batching gives under load.

    python -m conveyor.deploy.benchmarks.frameworks [--backends fil openvino tensorflow]
        [--protocol grpc http] [--seconds 4] [--perf-analyzer PATH]

For each backend whose framework is installed, one small model (FIL: an XGBoost classifier, 32
features, 100 trees of depth 6; OpenVINO and TensorFlow: an MLP 64-256-256-10), one instance with
one thread; and the same MLP on the onnxruntime backend, as the reference taken under the same
load (a shared host moves every figure; the differences between rows move less):

* **direct**: the framework's own call in this process on a 1-row batch (and a 16-row one), as an
  application embedding the framework would make it: the floor for one request; back to back, and
  **paced** (``PACED_GAP_S`` idle before each call, as at c=1, where every framework's call is slower);
* **c=1**: perf_analyzer, one request at a time, through a real group (``--workers 1``); the
  added cost is its p50 less the direct call's (best and median of ``--repeat`` runs); beside it
  the framework's call as the worker timed it (the statistics' ``compute_infer``), which after
  each idle gap runs on colder caches than the direct call's back-to-back loop;
* **c=16**: 16 requests in flight, dynamic batching on (max_queue_delay 200 µs): throughput, and
  the requests per execution the batcher reached, beside the direct 16-row call's rows per second.

Writes bench-results/frameworks.{json,md}; the figures go into docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.deploy.benchmarks.perf import ROOT, PerfAnalyzerFailed, perf_analyzer, run_one, wait_ready

HTTP, GRPC = 18310, 18311
MODEL = "bench"
BATCHING = "dynamic_batching { max_queue_delay_microseconds: 200 }\ninstance_group [{ count: 1 kind: KIND_CPU }]\n"
Call = Callable[[np.ndarray], Any]


def _write(repo: str, config: str) -> str:
    vdir = os.path.join(repo, MODEL, "1")
    os.makedirs(vdir, exist_ok=True)
    Path(repo, MODEL, "config.pbtxt").write_text(f'name: "{MODEL}"\n' + config)
    return vdir


def fil_model(repo: str) -> tuple[Call, int]:
    import xgboost as xgb

    rng = np.random.default_rng(0)
    x = rng.random((2000, 32), dtype=np.float32)
    booster = xgb.train({"objective": "binary:logistic", "max_depth": 6, "nthread": 1},
                        xgb.DMatrix(x, label=x[:, 0] + x[:, 1] > 1), 100)
    booster.save_model(os.path.join(_write(repo, f"""backend: "fil"
max_batch_size: 8192
input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ 32 ] }}]
output [{{ name: "output__0" data_type: TYPE_FP32 dims: [ 2 ] }}]
parameters [{{ key: "model_type" value: {{ string_value: "xgboost_json" }} }},
            {{ key: "is_classifier" value: {{ string_value: "true" }} }},
            {{ key: "predict_proba" value: {{ string_value: "true" }} }},
            {{ key: "cpu_nthread" value: {{ string_value: "1" }} }}]
{BATCHING}"""), "xgboost.json"))
    booster.set_param({"nthread": 1})
    return booster.inplace_predict, 32


def _mlp_onnx() -> Any:
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    sizes, nodes, inits, prev = [64, 256, 256, 10], [], [], "x"
    for i in range(3):
        w = rng.standard_normal((sizes[i], sizes[i + 1])).astype(np.float32) / 8
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, list(w.shape), w.ravel()))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        prev = f"h{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
            prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, inits


MLP_IO = """max_batch_size: 64
input [{ name: "x" data_type: TYPE_FP32 dims: [ 64 ] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [ 10 ] }]
"""


def openvino_model(repo: str) -> tuple[Call, int]:
    import onnx
    import openvino as ov

    vdir = _write(repo, 'backend: "openvino"\n' + MLP_IO + BATCHING
                  + 'parameters { key: "INFERENCE_NUM_THREADS" value: { string_value: "1" } }\n')
    source = os.path.join(vdir, "source.onnx")
    onnx.save(_mlp_onnx()[0], source)
    model = ov.convert_model(source)
    os.remove(source)
    ov.save_model(model, os.path.join(vdir, "model.xml"), compress_to_fp16=False)
    core = ov.Core()
    compiled = core.compile_model(core.read_model(os.path.join(vdir, "model.xml")), "CPU",
                                  {"INFERENCE_NUM_THREADS": "1"})
    request = compiled.create_infer_request()
    output = compiled.output("y")
    return (lambda x: request.infer({"x": x}, share_inputs=True, share_outputs=True)[output]), 64


def tensorflow_model(repo: str) -> tuple[Call, int]:
    import tensorflow as tf
    from onnx import numpy_helper

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    weights = [tf.constant(numpy_helper.to_array(t)) for t in _mlp_onnx()[1]]

    class Mlp(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            h = tf.nn.relu(x @ weights[0])
            return {"y": tf.nn.relu(h @ weights[1]) @ weights[2]}

    module = Mlp()
    path = os.path.join(_write(repo, 'platform: "tensorflow_savedmodel"\n' + MLP_IO + BATCHING
                               + 'parameters { key: "TF_NUM_INTRA_THREADS" value: { string_value: "1" } }\n'
                               + 'parameters { key: "TF_NUM_INTER_THREADS" value: { string_value: "1" } }\n'),
                        "model.savedmodel")
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    signature = tf.saved_model.load(path).signatures["serving_default"]
    return (lambda x: signature(x=tf.convert_to_tensor(x))["y"].numpy()), 64


def onnxruntime_model(repo: str) -> tuple[Call, int]:
    """The reference: the same MLP on the onnxruntime backend, whose request path docs/PERFORMANCE.md
    measures, so each framework's figures can be read against one taken under the same load."""
    import onnx
    import onnxruntime as ort

    path = os.path.join(_write(repo, 'platform: "onnxruntime_onnx"\n' + MLP_IO + BATCHING), "model.onnx")
    onnx.save(_mlp_onnx()[0], path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
    return (lambda x: session.run(["y"], {"x": x})[0]), 64


BUILDERS = {"onnxruntime": ("onnxruntime", onnxruntime_model), "fil": ("xgboost", fil_model),
            "openvino": ("openvino", openvino_model), "tensorflow": ("tensorflow", tensorflow_model)}


# The pause before each paced direct call: about a served c=1 request's period on the 2-vCPU VM, during which
# the worker's framework sits idle (its threads asleep, its caches used by others) as at c=1.
PACED_GAP_S = 0.002


def direct_us(call: Call, x: np.ndarray, seconds: float, gap_s: float = 0.0) -> tuple[float, float]:
    """Median and p90 of the framework's own call on ``x``, in µs; back to back, or ``gap_s`` after the last."""
    for _ in range(50):
        call(x)
    times: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gap_s:
            time.sleep(gap_s)
        t0 = time.perf_counter_ns()
        call(x)
        times.append((time.perf_counter_ns() - t0) / 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9)]


def stats() -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{HTTP}/v2/models/{MODEL}/stats", timeout=5) as r:
        s = json.load(r)["model_stats"][0]
    return {"requests": int(s["inference_stats"]["success"]["count"]), "executions": int(s["execution_count"]),
            "infer_ns": int(s["inference_stats"]["compute_infer"]["ns"])}


def serve(repo: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "conveyor.deploy.cli", "serve", "--group", f"fwb{os.getpid()}",
           "--model-repository", repo, "--workers", "1", "--http-address", "127.0.0.1", "--grpc-address",
           "127.0.0.1", "--http-port", str(HTTP), "--grpc-port", str(GRPC), "--metrics-port", str(GRPC + 1)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _run(pa: Path, url: str, protocol: str, concurrency: int, seconds: int) -> dict[str, float] | None:
    """One perf_analyzer run; None (reported) when it found no stable window on a busy host."""
    try:
        # perf_analyzer stops after at most 10 windows (its --max-trials); the margin covers start-up.
        return run_one(pa, url, protocol, MODEL, concurrency, seconds, timeout=seconds * 12 + 60)
    except PerfAnalyzerFailed as e:
        print(f"  c={concurrency} {protocol}: run dropped: {str(e).strip().splitlines()[-1]}", file=sys.stderr,
              flush=True)
        return None


def measure(backend: str, pa: Path, protocols: list[str], seconds: int, repeat: int) -> list[dict[str, Any]]:
    """``repeat`` short perf_analyzer runs per point, alternating c=1 and c=16: on a shared host the
    best p50 (and best throughput) is the least disturbed estimate; the median is reported beside it."""
    repo = tempfile.mkdtemp(prefix=f"conveyor-{backend}-bench-")
    call, features = BUILDERS[backend][1](repo)
    rng = np.random.default_rng(1)
    one, sixteen = rng.random((1, features), dtype=np.float32), rng.random((16, features), dtype=np.float32)
    d1, d1_p90 = direct_us(call, one, seconds)
    paced, _ = direct_us(call, one, seconds, PACED_GAP_S)
    d16, _ = direct_us(call, sixteen, seconds)
    del call  # the framework's threads stay, idle, while the group runs
    rows = []
    proc = serve(repo)
    try:
        wait_ready(f"127.0.0.1:{HTTP}", timeout=300, ports=(GRPC,))
        for protocol in protocols:
            url = f"127.0.0.1:{HTTP if protocol == 'http' else GRPC}"
            c1s, c16s, per_exec, served = [], [], [], []
            for _ in range(repeat):  # a run perf_analyzer could not settle is dropped, the others kept
                before = stats()
                if (c1 := _run(pa, url, protocol, 1, seconds)) is not None:
                    c1s.append(c1)
                    after = stats()
                    served.append((after["infer_ns"] - before["infer_ns"])
                                  / max(after["executions"] - before["executions"], 1) / 1000)
                before = stats()
                if (c16 := _run(pa, url, protocol, 16, seconds)) is not None:
                    c16s.append(c16)
                    after = stats()
                    per_exec.append((after["requests"] - before["requests"])
                                    / max(after["executions"] - before["executions"], 1))
            if not c1s or not c16s:
                raise SystemExit(f"{backend} over {protocol}: every perf_analyzer run failed")
            c1_p50s = sorted(r["p50_us"] for r in c1s)
            c16_rates = sorted(r["infer_per_sec"] for r in c16s)
            best_c16 = max(c16s, key=lambda r: r["infer_per_sec"])
            row = {
                "backend": backend, "protocol": protocol, "repeat": repeat,
                "direct_1row_p50_us": d1, "direct_1row_p90_us": d1_p90, "direct_16rows_us": d16,
                "direct_16rows_per_s": 16 / d16 * 1e6,
                # The framework's call inside the worker at c=1 (the statistics' compute_infer): after an idle
                # gap, on caches the other actors used in between, it takes longer than back to back.
                "c1_served_call_us": statistics.median(served),
                "c1_p50_us": c1_p50s[0], "c1_p50_median_us": statistics.median(c1_p50s),
                "c1_p99_us": min(r["p99_us"] for r in c1s),
                "added_p50_us": c1_p50s[0] - d1, "added_p50_median_us": statistics.median(c1_p50s) - d1,
                # Against the call made at c=1's pace: what serving adds to an application's own paced call.
                "direct_paced_p50_us": paced, "added_to_paced_p50_us": c1_p50s[0] - paced,
                "c16_infer_per_s": c16_rates[-1], "c16_infer_per_s_median": statistics.median(c16_rates),
                "c16_p50_us": best_c16["p50_us"], "c16_p99_us": best_c16["p99_us"],
                "c16_requests_per_execution": statistics.median(per_exec),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", nargs="+", default=list(BUILDERS), choices=list(BUILDERS))
    ap.add_argument("--protocol", nargs="+", default=["grpc", "http"])
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="perf_analyzer runs per point (best and median kept)")
    ap.add_argument("--perf-analyzer", type=Path, default=None, help="the perf_analyzer binary (default: "
                    ".cache/perf_analyzer/perf_analyzer, installed there when missing)")
    ap.add_argument("--out", default=str(ROOT / "bench-results"))
    args = ap.parse_args()
    pa = args.perf_analyzer or perf_analyzer(ROOT / ".cache")
    results: list[dict[str, Any]] = []
    for backend in args.backends:
        if importlib.util.find_spec(BUILDERS[backend][0]) is None:
            print(f"{backend}: {BUILDERS[backend][0]} is not installed (pip install 'conveyor[{backend}]'), skipped")
            continue
        results += measure(backend, pa, args.protocol, args.seconds, args.repeat)
    os.makedirs(args.out, exist_ok=True)
    Path(args.out, "frameworks.json").write_text(json.dumps(results, indent=2))
    lines = ["| backend | protocol | direct 1 row µs (p50/p90) | paced direct µs | served call at c=1 µs | "
             "c=1 p50 µs (best / median) | added to paced µs | added at c=1 µs (best / median) | "
             "c=16 infer/s (best / median) | c=16 p50 µs | requests/execution | direct 16 rows: rows/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['backend']} | {r['protocol']} | {r['direct_1row_p50_us']:.0f} / {r['direct_1row_p90_us']:.0f} | "
              f"{r['direct_paced_p50_us']:.0f} | {r['c1_served_call_us']:.0f} | "
              f"{r['c1_p50_us']:.0f} / {r['c1_p50_median_us']:.0f} | {r['added_to_paced_p50_us']:.0f} | "
              f"{r['added_p50_us']:.0f} / "
              f"{r['added_p50_median_us']:.0f} | {r['c16_infer_per_s']:.0f} / {r['c16_infer_per_s_median']:.0f} | "
              f"{r['c16_p50_us']:.0f} | {r['c16_requests_per_execution']:.1f} | {r['direct_16rows_per_s']:.0f} |"
              for r in results]
    Path(args.out, "frameworks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
