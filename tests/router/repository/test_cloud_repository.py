"""s3:// model repositories against a real local S3 server (moto in server mode):
models load from the bucket, poll mode follows objects added and removed, and
Triton's credential file is honoured. No network beyond loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.deploy.ports import free_port
from tests.support.cloud_scenario import files_under, serve_and_follow

LEVEL = "e2e"

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")
pytestmark = pytest.mark.timeout(180)


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


def test_s3_repository_loads_and_follows_the_bucket(s3: tuple[str, object], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, client = s3

    def upload_tree(local_repo: str) -> None:
        for path, rel in files_under(local_repo):
            client.upload_file(path, "models", f"repo/{rel}")  # type: ignore[attr-defined]

    def delete_model(model: str) -> None:
        listing = client.list_objects_v2(Bucket="models", Prefix=f"repo/{model}/")  # type: ignore[attr-defined]
        for obj in listing.get("Contents", []):
            client.delete_object(Bucket="models", Key=obj["Key"])  # type: ignore[attr-defined]

    # Triton's credential file: any key works with moto, but the file must be read without error.
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"s3": {"": {"key_id": "testing", "secret_key": "testing", "region": "us-east-1"}}}))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(creds))
    serve_and_follow(f"s3://{endpoint}/models/repo", upload_tree, delete_model, tmp_path, monkeypatch)


def test_unsupported_scheme_is_refused_at_start(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", "hdfs://namenode/models",
         "--group", f"u{os.getpid()}", "--http-port", str(free_port()), "--grpc-port", str(free_port()),
         "--metrics-port", str(free_port())],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "hdfs:// repositories are not supported (s3://, gs://, as:// and local paths are)" in proc.stderr


@pytest.mark.parametrize(("path", "line"), [
    ("nobucket/repo", "Internal - cannot list s3://{endpoint}/nobucket/repo: "),
    ("models/nothing-here", "Invalid argument - repository path is not a valid directory"),
])
def test_a_bucket_path_without_a_repository_stops_the_start(s3: tuple[str, object], tmp_path: Path, path: str,
                                                           line: str) -> None:
    """As Triton, which cannot create its server on a bucket it cannot list, or on a path under which the bucket
    holds nothing: one line on stderr, exit code 1, nothing left running (the router lists the bucket at
    start-up, says so and exits; the supervisor stops the group)."""
    endpoint, _ = s3
    group = f"nb{os.getpid()}{path[0]}"
    proc = subprocess.run(
        [sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", f"s3://{endpoint}/{path}",
         "--group", group, "--workers", "1", "--grpc-ingress", "0", "--allow-metrics", "false",
         "--http-address", "127.0.0.1", "--http-port", str(free_port()), "--arena-size", str(8 << 20)],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, CONVEYOR_REPOSITORY_CACHE=str(tmp_path)),
    )
    assert proc.returncode == 1, proc.stderr
    wanted = "error: creating server: " + line.format(endpoint=endpoint)
    assert [row for row in proc.stderr.splitlines() if row.startswith(wanted)], proc.stderr
    assert "the router stopped: it could not create the server (above)" in proc.stderr
    assert "restarting" not in proc.stderr and "Traceback" not in proc.stderr
    assert not [e for e in os.listdir("/dev/shm") if e.startswith(f"conveyor.{group}.")]


def test_s3_endpoint_from_the_environment(s3: tuple[str, object], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """An S3-compatible store named by boto3's AWS_ENDPOINT_URL_S3 (the Helm chart's
    modelRepository.cloud.endpointUrl), the URL naming only bucket and path."""
    from conveyor.router.repository.cloud.s3 import S3Repository

    endpoint, client = s3
    client.put_object(Bucket="models", Key="env/m/config.pbtxt", Body=b'name: "m"')  # type: ignore[attr-defined]
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://{endpoint}")
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    local = S3Repository.parse("s3://models/env", str(tmp_path)).sync()
    assert (Path(local) / "m" / "config.pbtxt").read_bytes() == b'name: "m"'
