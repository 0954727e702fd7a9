"""The models the tests serve, made with onnx.helper and torch.jit (nothing downloaded)."""

from __future__ import annotations

import os

from conveyor.deploy.example_repo import add_sub, identity
from tests import python_models

LABELS = [f"label_{i}" for i in range(10)]


def build_test_repository(repo: str) -> None:
    add_sub(repo, "simple", 8, "dynamic_batching { max_queue_delay_microseconds: 2000 }")
    add_sub(repo, "simple_nobatch", 0)
    identity(repo, "identity_fp32", "FP32", 0, "-1")
    identity(repo, "identity_fp16", "FP16", 0, "-1")
    identity(repo, "identity_bool", "BOOL", 0, "-1")
    identity(repo, "identity_int64_batched", "INT64", 16, "-1", "dynamic_batching { }")
    identity(repo, "simple_string", "BYTES", 8, "16", "dynamic_batching { }")
    identity(repo, "classifier", "FP32", 4, "10", "", 'label_filename: "labels.txt"')
    with open(os.path.join(repo, "classifier", "labels.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(LABELS) + "\n")
    add_sub(repo, "no_config", 8)
    os.remove(os.path.join(repo, "no_config", "config.pbtxt"))  # completed from the ONNX graph
    add_sub(repo, "simple_two_instances", 8, "instance_group [{ count: 2 kind: KIND_CPU }]")
    # Broken models: the server must keep serving the others and say why.
    add_sub(repo, "gpu_only", 8, "instance_group [{ count: 1 kind: KIND_GPU }]")
    os.makedirs(os.path.join(repo, "bad_config", "1"))
    with open(os.path.join(repo, "bad_config", "config.pbtxt"), "w", encoding="utf-8") as f:
        f.write('name: "bad_config"\nplatform: "onnxruntime_onnx"\nmax_batch_size: [oops\n')
    add_sub(repo, "missing_file", 0)
    os.remove(os.path.join(repo, "missing_file", "1", "model.onnx"))
    python_models.build(repo)
    # A TensorRT engine needs TensorRT and a GPU: where either is missing it must say so and not hold others back.
    os.makedirs(os.path.join(repo, "trt_plan", "1"))
    with open(os.path.join(repo, "trt_plan", "1", "model.plan"), "wb") as f:
        f.write(b"not an engine")
    with open(os.path.join(repo, "trt_plan", "config.pbtxt"), "w", encoding="utf-8") as f:
        f.write('platform: "tensorrt_plan"\nmax_batch_size: 0\n'
                'input [{ name: "x" data_type: TYPE_FP32 dims: [4] }]\n'
                'output [{ name: "y" data_type: TYPE_FP32 dims: [4] }]\n')
    try:
        from tests import torch_models
    except ImportError:  # torch is an optional extra: its tests skip without it
        return
    torch_models.build(repo)
