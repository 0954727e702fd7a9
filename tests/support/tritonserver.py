"""``tritonserver`` started as a user starts it, with a command line from Triton's docs (tests/deploy)."""

from __future__ import annotations

import os
import subprocess
import sys

from conveyor.deploy.example_repo import add_sub, write_model
from conveyor.deploy.ports import free_port


class Triton:
    """``python -m conveyor.deploy.tritonserver`` with a command line from Triton's docs."""

    def __init__(self, line: str, repo: str, run_dir: str) -> None:
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        argv = line.replace("/models", repo).split()[1:]
        # The line runs as written; the harness only moves it to free loopback ports and makes it
        # quick to stop (later flags win, in Triton as here).
        harness = [f"--http-port={self.http}", f"--grpc-port={self.grpc}", f"--metrics-port={self.metrics}",
                   "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--workers=1",
                   f"--arena-size={32 << 20}", "--exit-timeout-secs=10", "--drain-grace-secs=0"]
        self.log = os.path.join(run_dir, f"triton-{self.http}.log")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "conveyor.deploy.tritonserver", *argv, *harness],
                                         stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "CONVEYOR_RUN_DIR": run_dir})

    def output(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(30)


def repo_with_simple(root: str, broken: bool = False) -> str:
    repo = os.path.join(root, "models")
    os.makedirs(repo, exist_ok=True)
    add_sub(repo, "simple", 8)
    if broken:
        # A config Triton cannot read fails its poll (the model is never added); a model file it cannot load
        # fails the load (the model is there, not ready).
        write_model(repo, "bad_config", 'platform: "onnxruntime_onnx"\nmax_batch_size: [oops\n')
        write_model(repo, "bad_model", 'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
                    'input [{ name: "X" data_type: TYPE_FP32 dims: [1] }]\n'
                    'output [{ name: "Y" data_type: TYPE_FP32 dims: [1] }]\n', {"model.onnx": b"no model"})
    return repo
