"""The scenario every object store passes: serve a model from the bucket, then
poll mode picks up an added model and drops a removed one."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th

from conveyor.deploy.example_repo import add_sub, identity
from tests.support.group import start_server
from tests.support.waiting import eventually


def files_under(local_repo: str) -> list[tuple[str, str]]:
    """(path, path relative to ``local_repo``) for every file of a local tree."""
    return [(str(p), str(p.relative_to(local_repo))) for p in Path(local_repo).rglob("*") if p.is_file()]


def serve_and_follow(url: str, upload_tree: Callable[[str], None], delete_model: Callable[[str], None],
                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``upload_tree(dir)`` puts a local repository tree under the bucket path of ``url``;
    ``delete_model(name)`` deletes every object of that model."""
    staged = str(tmp_path / "staged")
    add_sub(staged, "simple", 8)
    upload_tree(staged)
    monkeypatch.setenv("CONVEYOR_REPOSITORY_CACHE", str(tmp_path / "cache"))
    srv = start_server(url, f"c{os.getpid()}", "--workers", "1", "--grpc-ingress", "0",
                       "--model-control-mode", "poll", "--repository-poll-secs", "0.5", grpc=False)
    try:
        http = th.InferenceServerClient(srv.http_url)
        assert http.is_model_ready("simple")
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [th.InferInput("INPUT0", [1, 16], "INT32"), th.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        np.testing.assert_array_equal(http.infer("simple", inputs).as_numpy("OUTPUT0"), a + a)

        more = str(tmp_path / "more")
        identity(more, "identity_fp32", "FP32", 0, "-1")
        upload_tree(more)
        eventually(lambda: http.is_model_ready("identity_fp32"), timeout=60.0, interval=0.3)
        delete_model("identity_fp32")
        eventually(lambda: not http.is_model_ready("identity_fp32"), timeout=60.0, interval=0.3)
        assert http.is_model_ready("simple")
    finally:
        assert srv.stop() == 0
