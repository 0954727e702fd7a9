"""s3:// model repositories against a real local S3 server (moto in server mode):
models load from the bucket, poll mode follows objects added and removed, and
Triton's credential file is honoured. No network beyond loopback."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th

from conveyor.deploy.example_repo import add_sub, identity
from tests.conftest import free_port, start_server

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")
pytestmark = pytest.mark.timeout(180)


def eventually(check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[str, object]]:
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}")
    client.create_bucket(Bucket="models")
    try:
        yield f"127.0.0.1:{port}", client
    finally:
        server.stop()


def upload(client: object, local_repo: str, prefix: str) -> None:
    for path in Path(local_repo).rglob("*"):
        if path.is_file():
            client.upload_file(str(path), "models", f"{prefix}/{path.relative_to(local_repo)}")  # type: ignore[attr-defined]


def delete_model(client: object, prefix: str, model: str) -> None:
    listing = client.list_objects_v2(Bucket="models", Prefix=f"{prefix}/{model}/")  # type: ignore[attr-defined]
    for obj in listing.get("Contents", []):
        client.delete_object(Bucket="models", Key=obj["Key"])  # type: ignore[attr-defined]


def test_s3_repository_loads_and_follows_the_bucket(s3: tuple[str, object], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, client = s3
    staged = str(tmp_path / "staged")
    add_sub(staged, "simple", 8)
    upload(client, staged, "repo")
    # Triton's credential file: any key works with moto, but the file must be read without error.
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"s3": {"": {"key_id": "testing", "secret_key": "testing", "region": "us-east-1"}}}))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(creds))
    monkeypatch.setenv("CONVEYOR_REPOSITORY_CACHE", str(tmp_path / "cache"))
    srv = start_server(f"s3://{endpoint}/models/repo", f"c{os.getpid()}", "--workers", "1", "--grpc-ingress", "0",
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
        upload(client, more, "repo")
        eventually(lambda: http.is_model_ready("identity_fp32"))
        delete_model(client, "repo", "identity_fp32")
        eventually(lambda: not http.is_model_ready("identity_fp32"))
        assert http.is_model_ready("simple")
    finally:
        assert srv.stop() == 0


def test_unsupported_scheme_is_refused_at_start(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", "gs://bucket/models",
         "--group", f"u{os.getpid()}", "--http-port", str(free_port()), "--grpc-port", str(free_port()),
         "--metrics-port", str(free_port())],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "gs:// repositories are not supported yet" in proc.stderr
