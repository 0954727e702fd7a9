"""Per-batch latency of a small model on the CPU as TorchScript, uncompiled and compiled
(``conveyor.torch_compile`` with aot_eager, and inductor where a C++ compiler is), and as a
PyTorch 2 package (``platform: "torch_aoti"``: torch.export + AOTInductor, where a C++ compiler is),
measured at the backend (its ``execute``: numpy in, numpy out), on one intra-op thread as a worker
runs it, the variants taking turns call by call. Not a test:
``python -m conveyor.deploy.benchmarks.torch_compile``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import torch

from conveyor.proto.model_config import parse_text
from conveyor.workers.backends import load_backend
from tests.support.torch_models import compile_parameters, export_pt2, save


class Small(torch.nn.Module):
    """A small MLP classifier: 64 features -> 256 -> 256 -> 10, GELU and LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(64, 256)
        self.b = torch.nn.Linear(256, 256)
        self.norm = torch.nn.LayerNorm(256)
        self.head = torch.nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.a(x))
        h = self.norm(torch.nn.functional.gelu(self.b(h)) + h)
        return torch.softmax(self.head(h), dim=1)


class Pointwise(torch.nn.Module):
    """Elementwise work only (what a compiler fuses): six rounds of gelu(h) * sigmoid(h) + h / 2."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for _ in range(6):
            h = torch.nn.functional.gelu(h) * torch.sigmoid(h) + h * 0.5
        return h


CONFIG = """platform: "pytorch_libtorch"
max_batch_size: 64
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {width} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {out} ] }} ]
"""
PT2 = "PyTorch 2 package (.pt2)"
PT2_CONFIG = CONFIG.replace('platform: "pytorch_libtorch"', 'platform: "torch_aoti"')
# name -> (module, input width, output width)
MODELS: dict[str, tuple[type[torch.nn.Module], int, int]] = {"mlp": (Small, 64, 10), "pointwise": (Pointwise, 256, 256)}


def measure(backends: dict[str, Any], rows: int, width: int, seconds: float) -> dict[str, tuple[float, float]]:
    """Median and p90 of one execute, in microseconds, per variant. The variants take
    turns call by call, so a busy machine slows them alike."""
    x = {"INPUT__0": np.random.default_rng(rows).random((rows, width), dtype=np.float32)}
    times: dict[str, list[int]] = {name: [] for name in backends}
    for backend in backends.values():
        for _ in range(20):
            backend.execute(x, ["OUTPUT__0"])
    end = time.perf_counter() + seconds * len(backends)
    while time.perf_counter() < end:
        for name, backend in backends.items():
            t = time.perf_counter_ns()
            backend.execute(x, ["OUTPUT__0"])
            times[name].append(time.perf_counter_ns() - t)
    out = {}
    for name, ts in times.items():
        ts.sort()
        out[name] = (statistics.median(ts) / 1000, ts[int(len(ts) * 0.9)] / 1000)
    return out


INDUCTOR_FREEZING = (' parameters { key: "TORCH_COMPILE_OPTIONAL_PARAMETERS" '
                     """value { string_value: '{"options": {"freezing": true}}' } }""")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0, help="per batch size and variant")
    args = parser.parse_args()
    variants = {"TorchScript (uncompiled)": "", "aot_eager": compile_parameters(backend="aot_eager")}
    if shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++"):
        variants["inductor"] = compile_parameters(backend="inductor")
        variants["inductor, freezing"] = compile_parameters(backend="inductor") + INDUCTOR_FREEZING
    repo = tempfile.mkdtemp()
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, 1 intra-op thread\n")
    for model, (cls, width, out) in MODELS.items():
        module = cls().eval()
        script = torch.jit.script(module)
        backends, load_s = {}, {}
        for i, (name, parameters) in enumerate(variants.items()):
            text = CONFIG.format(width=width, out=out) + parameters
            path = save(script, repo, f"{model}{i}", text)
            t = time.perf_counter()
            backends[name] = load_backend("pytorch", path, parse_text(text), "cpu")
            load_s[name] = time.perf_counter() - t
        if "inductor" in variants:  # AOTInductor compiles C++ as inductor does
            t = time.perf_counter()
            path = export_pt2(module, os.path.join(repo, f"{model}_pt2", "1", "model.pt2"), 64, quick=False,
                              width=width)
            backends[PT2] = load_backend("pytorch", path, parse_text(PT2_CONFIG.format(width=width, out=out)), "cpu")
            load_s[PT2] = time.perf_counter() - t  # export and compile (once, ahead of serving) and load
        results = {rows: measure(backends, rows, width, args.seconds) for rows in (1, 8, 64)}
        print(f"{model} (load average {os.getloadavg()[0]:.1f})\n")
        print("| variant | load (s) | " + " | ".join(f"batch {b}: median / p90 (µs), ÷ TorchScript" for b in results)
              + " |")
        print("|---|---|---|---|---|")
        base = next(iter(backends))
        for name in backends:
            cells = [f"{results[rows][name][0]:.0f} / {results[rows][name][1]:.0f}, "
                     f"{results[rows][name][0] / results[rows][base][0]:.2f}" for rows in results]
            print(f"| {name} | {load_s[name]:.1f} | " + " | ".join(cells) + " |")
        print()

if __name__ == "__main__":
    main()
