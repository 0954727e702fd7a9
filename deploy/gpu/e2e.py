"""The end-to-end half of the GPU check (run by deploy/gpu/check.sh): a real ``conveyor serve``
group with TorchScript models on ``cuda:0``, driven by tritonclient over HTTP and gRPC, CUDA
shared memory in and out, NVML series on ``/metrics``, a short load, a clean shutdown.

Each item ends PASS, FAIL, SKIP or GAP (a known difference from Triton, listed in the report but
not failing the check). Without a GPU (``--dry``, a developer's machine) the models run on the CPU,
system shared memory stands in for CUDA's and the GPU-only items are skipped: that proves this
script, the group start and the client paths before GPU time is spent on them.

    python3 deploy/gpu/e2e.py --rows ROWS.md --log SERVER.log [--dry]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

N = 16  # elements per input: small, the point is where the data goes, not how fast
GPU_METRICS = ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
               "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_energy_consumption")

TORCH_CONFIG = """name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 0
input [
  {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {n} ] }},
  {{ name: "INPUT__1" data_type: TYPE_FP32 dims: [ {n} ] }}
]
output [
  {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {n} ] }},
  {{ name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ {n} ] }},
  {{ name: "OUTPUT__2" data_type: TYPE_FP32 dims: [ 1 ] }}
]
{extra}
"""


@dataclass
class Report:
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, item: str, status: str, detail: str = "") -> None:
        self.rows.append((item, status, detail))
        print(f"[{status}] {item}: {detail}", flush=True)

    @contextmanager
    def item(self, name: str) -> Iterator[list[str]]:
        """PASS with the detail the body appends, FAIL with the exception it raises."""
        detail: list[str] = []
        try:
            yield detail
        except Exception as exc:
            self.add(name, "FAIL", f"{type(exc).__name__}: {exc}"[:300])
        else:
            self.add(name, "PASS", "; ".join(detail))

    def failed(self) -> bool:
        return any(status == "FAIL" for _, status, _ in self.rows)

    def markdown(self) -> str:
        cell = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
        return "".join(f"| {cell(i)} | {s} | {cell(d)} |\n" for i, s, d in self.rows)


def http_get(url: str, timeout: float = 5.0, post: bytes | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=post), timeout=timeout) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:  # refused, reset, timed out: not up (yet), the callers poll
        return 0, f"{type(exc).__name__}: {exc}"


def build_repo(repo: str, gpu: bool) -> None:
    """TorchScript add/sub that also says where it ran (OUTPUT__2: 1.0 on a CUDA device), on
    ``cuda:0`` (KIND_GPU) and with no ``instance_group``; an ONNX identity on the CPU."""
    from conveyor.deploy.example_repo import identity

    identity(repo, "onnx_cpu", "FP32", 0, "-1")  # first: the group starts with it even without torch
    import torch

    class DeviceAddSub(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            where = torch.ones_like(a[:1]) * (1.0 if a.is_cuda else 0.0)
            return a + b, a - b, where

    module = torch.jit.script(DeviceAddSub())
    group = "instance_group [{ kind: KIND_GPU count: 1 gpus: [0] }]" if gpu else \
        "instance_group [{ kind: KIND_CPU count: 1 }]"
    for name, extra in (("torch_gpu", group), ("torch_auto", "")):
        os.makedirs(os.path.join(repo, name, "1"))
        module.save(os.path.join(repo, name, "1", "model.pt"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w", encoding="utf-8") as f:
            f.write(TORCH_CONFIG.format(name=name, n=N, extra=extra))


class Regions:
    """tritonclient's CUDA shared memory helpers, or its system ones standing in for them (dry)."""

    def __init__(self, cuda: bool, group: str) -> None:
        self.cuda = cuda
        self._prefix = f"/{group}_"
        if cuda:
            import tritonclient.utils.cuda_shared_memory as mod
        else:
            import tritonclient.utils.shared_memory as mod
        self.mod: Any = mod
        self.kind = "CUDA" if cuda else "system"

    def create(self, name: str, size: int) -> Any:
        if self.cuda:
            return self.mod.create_shared_memory_region(name, size, 0)
        return self.mod.create_shared_memory_region(name, self._prefix + name, size)

    def register(self, client: Any, name: str, handle: Any, size: int) -> None:
        if self.cuda:
            client.register_cuda_shared_memory(name, self.mod.get_raw_handle(handle), 0, size)
        else:
            client.register_system_shared_memory(name, self._prefix + name, size)

    def unregister(self, client: Any) -> None:
        (client.unregister_cuda_shared_memory if self.cuda else client.unregister_system_shared_memory)()

    def set(self, handle: Any, arrays: list[np.ndarray]) -> None:
        self.mod.set_shared_memory_region(handle, arrays)

    def get(self, handle: Any, shape: list[int]) -> np.ndarray:
        dtype: Any = np.float32  # tritonclient 2.73 takes a numpy dtype for CUDA regions too
        return np.asarray(self.mod.get_contents_as_numpy(handle, dtype, shape))

    def destroy(self, handle: Any) -> None:
        self.mod.destroy_shared_memory_region(handle)


class Check:
    def __init__(self, report: Report, gpu: bool, log_path: str) -> None:
        self.report, self.gpu, self.log_path = report, gpu, log_path
        self.group = f"gpuchk{os.getpid()}"
        from conveyor.deploy.ports import free_ports

        self.ports = dict(zip(("http", "grpc", "metrics"), free_ports(3), strict=True))
        self.repo = tempfile.mkdtemp(prefix="conveyor-gpu-check-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.a = np.arange(N, dtype=np.float32)
        self.b = np.full(N, 2.0, dtype=np.float32)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    def start(self) -> None:
        with self.report.item("build the models (TorchScript scripted here, ONNX identity)") as d:
            build_repo(self.repo, self.gpu)
            d.append("KIND_GPU gpus [0] on cuda:0" if self.gpu else "dry: KIND_CPU")
        cmd = [
            sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", self.repo,
            "--group", self.group, "--workers", "2", "--allow-client-shm", "true",
            "--http-port", str(self.ports["http"]), "--grpc-port", str(self.ports["grpc"]),
            "--metrics-port", str(self.ports["metrics"]), "--http-address", "127.0.0.1",
            "--grpc-address", "127.0.0.1", "--metrics-interval-ms", "500",
            "--arena-size", str(64 << 20), "--exit-timeout-secs", "10", "--drain-grace-secs", "0",
        ]
        with self.report.item("the group starts (router, 2 workers, HTTP, gRPC, metrics)") as d:
            t0 = time.monotonic()
            log = open(self.log_path, "ab")  # the child writes to it until it exits
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            deadline = t0 + 120
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"conveyor serve exited with {self.proc.returncode} (see the server log)")
                if time.monotonic() > deadline:
                    raise TimeoutError("not ready within 120 s")
                if self._listening() and http_get(f"http://{self.http_url}/v2/health/ready", 2)[0] == 200:
                    break
                time.sleep(0.3)
            d.append(f"ready in {time.monotonic() - t0:.1f} s")

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.ports["http"]), timeout=1):
                return True
        except OSError:
            return False

    def models_ready(self) -> None:
        for model in ("torch_gpu", "torch_auto", "onnx_cpu"):
            with self.report.item(f"model {model} READY") as d:
                code = http_get(f"http://{self.http_url}/v2/models/{model}/ready")[0]
                if code != 200:
                    _, index = http_get(f"http://{self.http_url}/v2/repository/index", 5, b"{}")
                    raise AssertionError(f"HTTP {code}; repository index: {index[:250]}")
                d.append("HTTP 200")

    def _expect(self, outputs: Callable[[str], Any], on_gpu: bool | None) -> str:
        np.testing.assert_array_equal(outputs("OUTPUT__0"), self.a + self.b)
        np.testing.assert_array_equal(outputs("OUTPUT__1"), self.a - self.b)
        ran_on = "cuda" if float(outputs("OUTPUT__2")[0]) == 1.0 else "cpu"
        if on_gpu is not None and ran_on != ("cuda" if on_gpu else "cpu"):
            raise AssertionError(f"the model ran on {ran_on}")
        return f"outputs right, ran on {ran_on}"

    def plain_inference(self) -> None:
        import tritonclient.grpc as tg
        import tritonclient.http as th

        for proto, mod, url in (("HTTP", th, self.http_url), ("gRPC", tg, self.grpc_url)):
            with self.report.item(f"{proto} inference, TorchScript on {'cuda:0' if self.gpu else 'cpu (dry)'}") as d:
                client = mod.InferenceServerClient(url)
                inputs = [mod.InferInput("INPUT__0", [N], "FP32"), mod.InferInput("INPUT__1", [N], "FP32")]
                inputs[0].set_data_from_numpy(self.a)
                inputs[1].set_data_from_numpy(self.b)
                result = client.infer("torch_gpu", inputs)
                d.append(self._expect(result.as_numpy, self.gpu))
        # Triton puts a model with no instance_group (KIND_AUTO) on the GPU when there is one.
        client = th.InferenceServerClient(self.http_url)
        inputs = [th.InferInput("INPUT__0", [N], "FP32"), th.InferInput("INPUT__1", [N], "FP32")]
        inputs[0].set_data_from_numpy(self.a)
        inputs[1].set_data_from_numpy(self.b)
        name = "no instance_group (KIND_AUTO) goes to the GPU"
        try:
            where = self._expect(client.infer("torch_auto", inputs).as_numpy, None)
        except Exception as exc:
            self.report.add(name, "FAIL", f"{type(exc).__name__}: {exc}"[:300])
            return
        if not self.gpu:
            self.report.add(name, "SKIP", f"dry: {where}")
        else:
            self.report.add(name, "PASS" if where.endswith("cuda") else "GAP",
                            where + ("" if where.endswith("cuda") else " (Triton: on the GPU; issue 17, part 2)"))

    def shared_memory(self) -> None:
        import tritonclient.grpc as tg
        import tritonclient.http as th

        try:
            regions = Regions(self.gpu, self.group)
        except Exception as exc:
            self.report.add("tritonclient's cuda_shared_memory imports", "FAIL", f"{type(exc).__name__}: {exc}")
            return
        nbytes = self.a.nbytes
        ins = regions.create("chk_in", 2 * nbytes)
        outs = regions.create("chk_out", 2 * nbytes)
        http, grpc = th.InferenceServerClient(self.http_url), tg.InferenceServerClient(self.grpc_url)
        try:
            with self.report.item(f"{regions.kind} shm regions registered (one over HTTP, one over gRPC)") as d:
                regions.set(ins, [self.a, self.b])
                regions.register(http, "chk_in", ins, 2 * nbytes)
                regions.register(grpc, "chk_out", outs, 2 * nbytes)
                status = (http.get_cuda_shared_memory_status() if regions.cuda
                          else http.get_system_shared_memory_status())
                names = sorted(r["name"] for r in status)
                assert names == ["chk_in", "chk_out"], names
                d.append(f"status lists {names}")
            cases = [("torch_gpu", "TorchScript " + ("KIND_GPU, inputs used in place" if self.gpu else "(dry)")),
                     ("onnx_cpu", "ONNX KIND_CPU, through the host")]
            for model, what in cases:
                for proto, client, mod in (("HTTP", http, th), ("gRPC", grpc, tg)):
                    with self.report.item(f"{regions.kind} shm in and out, {proto}, {what}") as d:
                        regions.set(outs, [np.zeros(2 * N, dtype=np.float32)])
                        if model == "onnx_cpu":
                            inp = mod.InferInput("INPUT0", [N], "FP32")
                            inp.set_shared_memory("chk_in", nbytes)
                            out = mod.InferRequestedOutput("OUTPUT0")
                            out.set_shared_memory("chk_out", nbytes, offset=nbytes)
                            client.infer(model, [inp], outputs=[out])
                            np.testing.assert_array_equal(regions.get(outs, [2 * N])[N:], self.a)
                        else:
                            inputs = [mod.InferInput("INPUT__0", [N], "FP32"), mod.InferInput("INPUT__1", [N], "FP32")]
                            inputs[0].set_shared_memory("chk_in", nbytes)
                            inputs[1].set_shared_memory("chk_in", nbytes, offset=nbytes)
                            outputs = [mod.InferRequestedOutput("OUTPUT__0"), mod.InferRequestedOutput("OUTPUT__1")]
                            outputs[0].set_shared_memory("chk_out", nbytes)
                            outputs[1].set_shared_memory("chk_out", nbytes, offset=nbytes)
                            client.infer(model, inputs, outputs=outputs)
                            got = regions.get(outs, [2 * N])
                            np.testing.assert_array_equal(got[:N], self.a + self.b)
                            np.testing.assert_array_equal(got[N:], self.a - self.b)
                        d.append("output region holds the right values")
            with self.report.item(f"{regions.kind} shm unregistered") as d:
                regions.unregister(http)
                status = (http.get_cuda_shared_memory_status() if regions.cuda
                          else http.get_system_shared_memory_status())
                assert status == [], status
                d.append("status empty")
        finally:
            regions.destroy(ins)
            regions.destroy(outs)

    def load(self, requests: int = 400, concurrency: int = 8) -> None:
        import tritonclient.http as th

        latencies: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()

        def run(count: int) -> None:
            client = th.InferenceServerClient(self.http_url)
            inputs = [th.InferInput("INPUT__0", [N], "FP32"), th.InferInput("INPUT__1", [N], "FP32")]
            inputs[0].set_data_from_numpy(self.a)
            inputs[1].set_data_from_numpy(self.b)
            for _ in range(count):
                t0 = time.perf_counter()
                try:
                    out = client.infer("torch_gpu", inputs).as_numpy("OUTPUT__0")
                    np.testing.assert_array_equal(out, self.a + self.b)
                except Exception as exc:
                    with lock:
                        errors.append(str(exc)[:200])
                    return
                with lock:
                    latencies.append(time.perf_counter() - t0)

        with self.report.item(f"load: {requests} HTTP inferences at c={concurrency} on torch_gpu") as d:
            t0 = time.perf_counter()
            threads = [threading.Thread(target=run, args=(requests // concurrency,)) for _ in range(concurrency)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            wall = time.perf_counter() - t0
            assert not errors, errors[0]
            assert len(latencies) == requests, f"{len(latencies)} of {requests} answered"
            ms = np.percentile(np.array(latencies) * 1000, [50, 99])
            d.append(f"{requests / wall:.0f} infer/s, p50 {ms[0]:.2f} ms, p99 {ms[1]:.2f} ms (loopback, tiny tensors)")

    def metrics(self) -> None:
        url = f"http://127.0.0.1:{self.ports['metrics']}/metrics"
        deadline = time.monotonic() + 15
        text = ""
        while time.monotonic() < deadline:  # sampling starts with the first scrape
            text = http_get(url)[1]
            if re.search(r'^nv_gpu_utilization\{gpu_uuid="', text, re.M) or not self.gpu:
                if not self.gpu and "nv_cpu_utilization " not in text:
                    time.sleep(0.5)
                    continue
                break
            time.sleep(0.5)
        with self.report.item("/metrics: inference counters of torch_gpu") as d:
            m = re.search(r'^nv_inference_request_success\{model="torch_gpu",version="1"\} (\S+)', text, re.M)
            assert m and float(m.group(1)) > 0, "nv_inference_request_success for torch_gpu missing or 0"
            d.append(f"nv_inference_request_success {m.group(1)}")
        if not self.gpu:
            with self.report.item("/metrics: nv_cpu_* (dry stand-in for nv_gpu_*)") as d:
                assert re.search(r"^nv_cpu_utilization \S+", text, re.M), "nv_cpu_utilization missing"
                d.append("nv_cpu_utilization present")
            self.report.add("/metrics: NVML series nv_gpu_*, nv_energy_consumption", "SKIP", "dry: no GPU")
            return
        for name in GPU_METRICS:
            with self.report.item(f"/metrics: {name}") as d:
                values = re.findall(rf'^{name}\{{gpu_uuid="[^"]+"\}} (\S+)', text, re.M)
                assert values, f"no {name}{{gpu_uuid=...}} sample"
                d.append(", ".join(values))

    def stop(self) -> None:
        with self.report.item("clean shutdown (SIGTERM: exit 0, no shared memory left)") as d:
            if self.proc is None:
                raise RuntimeError("never started")
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
            left = [e for e in os.listdir("/dev/shm") if e.startswith(f"conveyor.{self.group}.")]
            assert code == 0, f"exit code {code}"
            assert not left, f"left in /dev/shm: {left}"
            d.append("exit 0")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def gpu_present() -> bool:
    try:
        import cupy
        import torch

        return bool(torch.cuda.is_available() and cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", required=True, help="write the report's table rows (markdown) here")
    p.add_argument("--log", required=True, help="the server's output goes here")
    p.add_argument("--dry", action="store_true", help="no GPU expected: CPU models, system shm, GPU items skipped")
    args = p.parse_args()
    # timeout(1) sends SIGTERM: end through the finally below, which stops the group it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    report = Report()
    gpu = gpu_present()
    if not args.dry and not gpu:
        report.add("a CUDA GPU is visible to torch and cupy", "FAIL", "none: not on a GPU machine? (--dry there)")
    check = Check(report, gpu, args.log)
    try:
        check.start()
        if check.proc is not None and check.proc.poll() is None:
            for step in (check.models_ready, check.plain_inference, check.shared_memory, check.load, check.metrics):
                try:
                    step()
                except Exception as exc:  # a step's own setup broke: one FAIL row, go on with the next
                    report.add(step.__name__, "FAIL", f"{type(exc).__name__}: {exc}"[:300])
            check.stop()
    finally:
        check.kill()
        with open(args.rows, "w", encoding="utf-8") as f:
            f.write(report.markdown())
    return 1 if report.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
