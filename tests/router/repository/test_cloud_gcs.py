"""gs:// model repositories against a real local GCS server (gcp-storage-emulator in
server mode, reached through ``STORAGE_EMULATOR_HOST``, which google-cloud-storage
honours): a model loads from the bucket, poll mode follows objects added and removed.
No network beyond loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.deploy.ports import free_port
from tests.support.cloud_scenario import files_under, serve_and_follow

LEVEL = "e2e"

storage = pytest.importorskip("google.cloud.storage", reason="gs:// tests need google-cloud-storage")
emulator = pytest.importorskip("gcp_storage_emulator.server", reason="gs:// tests need gcp-storage-emulator")
pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def gcs(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    port = free_port()
    try:
        server = emulator.create_server("127.0.0.1", port, in_memory=True, default_bucket="models")
        server.start()
    except Exception as exc:
        pytest.skip(f"gcp-storage-emulator did not start: {exc!r}")
    # Read by the client here and by the router the server starts: both talk to the emulator, anonymously.
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    try:
        yield storage.Client(project="test").bucket("models")
    finally:
        server.stop()


def test_gcs_repository_loads_and_follows_the_bucket(gcs: object, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def upload_tree(local_repo: str) -> None:
        for path, rel in files_under(local_repo):
            gcs.blob(f"repo/{rel}").upload_from_filename(path)  # type: ignore[attr-defined]

    def delete_model(model: str) -> None:
        for blob in list(gcs.list_blobs(prefix=f"repo/{model}/")):  # type: ignore[attr-defined]
            blob.delete()

    serve_and_follow("gs://models/repo", upload_tree, delete_model, tmp_path, monkeypatch)
