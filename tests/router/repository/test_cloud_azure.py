"""as:// model repositories against a real local Azure Blob server (Azurite), with
Triton's ``AZURE_STORAGE_ACCOUNT``/``AZURE_STORAGE_KEY`` and an endpoint template:
a model loads from the container, poll mode follows blobs added and removed.
No network beyond loopback.

Azurite is an npm package and large (about 350 MB), so the suite does not install
it. To run this test: ``npm install --prefix .cache/azurite azurite`` in the
repository root (``.cache/`` is git-ignored), or put ``azurite-blob`` on PATH, or
name it in ``AZURITE_BLOB``."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.deploy.ports import free_port
from conveyor.proto.errors import ConveyorError
from conveyor.router.repository.cloud.azure_blob import AzureRepository
from tests.support.cloud_scenario import files_under, serve_and_follow
from tests.support.paths import ROOT

LEVEL = "e2e"

blob = pytest.importorskip("azure.storage.blob", reason="as:// tests need azure-storage-blob")
pytestmark = pytest.mark.timeout(240)

# Azurite's well-known development account (public, documented by Microsoft; not a secret).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_LOCAL = ROOT / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"


def azurite_blob() -> str | None:
    named = os.environ.get("AZURITE_BLOB")
    if named:
        return shutil.which(named)  # None (so a skip) when it names nothing runnable
    if _LOCAL.exists():
        return str(_LOCAL)
    return shutil.which("azurite-blob")


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azurite's blob service on a free loopback port; yields its endpoint template."""
    exe = azurite_blob()
    if exe is None or shutil.which("node") is None:
        pytest.skip("Azurite not found ($AZURITE_BLOB, .cache/azurite, PATH) or no node: "
                    "npm install --prefix .cache/azurite azurite (see this module's docstring)")
    port = free_port()
    log_path = tmp_path_factory.mktemp("azurite") / "azurite.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
             "--extentMemoryLimit", "256", "--skipApiVersionCheck", "--loose", "--silent"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 90  # node starts slowly on a loaded 2-core machine
        while True:
            if proc.poll() is not None:
                pytest.skip(f"Azurite exited with {proc.returncode}: {log_path.read_text()[-500:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.skip("Azurite did not start listening within 90 s")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/{{account}}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:  # it closes gracefully, waiting on clients' keep-alive connections
            proc.kill()
            proc.wait(5)


@pytest.fixture
def container(azurite: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    # Triton's variables, read by the router the server starts, with the endpoint pointed at Azurite.
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_KEY", KEY)
    monkeypatch.setenv("CONVEYOR_AZURE_BLOB_ENDPOINT", azurite)
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    service = blob.BlobServiceClient(azurite.format(account=ACCOUNT),
                                     credential={"account_name": ACCOUNT, "account_key": KEY})
    client = service.create_container(f"models{uuid.uuid4().hex[:8]}")
    yield client
    client.delete_container()


def test_azure_repository_loads_and_follows_the_container(container: object, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def upload_tree(local_repo: str) -> None:
        for path, rel in files_under(local_repo):
            with open(path, "rb") as f:
                container.upload_blob(f"repo/{rel}", f, overwrite=True)  # type: ignore[attr-defined]

    def delete_model(model: str) -> None:
        for item in list(container.list_blobs(name_starts_with=f"repo/{model}/")):  # type: ignore[attr-defined]
            container.delete_blob(item.name)  # type: ignore[attr-defined]

    name = container.container_name  # type: ignore[attr-defined]
    serve_and_follow(f"as://{ACCOUNT}/{name}/repo", upload_tree, delete_model, tmp_path, monkeypatch)


def test_connection_string_and_credential_file(container: object, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The other two ways in, mirrored in-process: the SDK's connection string (its endpoint
    included), then Triton's credential file ``"as"`` section, which takes precedence."""
    container.upload_blob("m/a/config.pbtxt", b"name: 'a'")  # type: ignore[attr-defined]
    url = f"as://{ACCOUNT}/{container.container_name}/m"  # type: ignore[attr-defined]
    blob_endpoint = os.environ["CONVEYOR_AZURE_BLOB_ENDPOINT"].format(account=ACCOUNT)
    for var in ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY", "CONVEYOR_AZURE_BLOB_ENDPOINT"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};BlobEndpoint={blob_endpoint};")
    local = Path(AzureRepository.parse(url, str(tmp_path / "a")).sync())
    assert (local / "a" / "config.pbtxt").read_bytes() == b"name: 'a'"

    # A wrong key in the file wins over the (good) connection string: the listing is refused.
    creds = tmp_path / "creds.json"
    wrong_key = base64.b64encode(bytes(64)).decode()
    creds.write_text(json.dumps({"as": {"": {"account_str": ACCOUNT, "account_key": wrong_key}}}))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(creds))
    monkeypatch.setenv("CONVEYOR_AZURE_BLOB_ENDPOINT", os.path.dirname(blob_endpoint) + "/{account}")
    with pytest.raises(ConveyorError, match="cannot list"):
        AzureRepository.parse(url, str(tmp_path / "b")).sync()
    creds.write_text(json.dumps({"as": {"": {"account_str": ACCOUNT, "account_key": KEY}}}))
    local = Path(AzureRepository.parse(url, str(tmp_path / "c")).sync())
    assert (local / "a" / "config.pbtxt").exists()
