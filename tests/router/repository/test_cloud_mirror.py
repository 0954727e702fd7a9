"""The mirror shared by every object store, against an in-memory store: only changed
objects are downloaded, files land whole, removed objects are pruned; plus URL
parsing and Triton's credential file for each store. No server, no client library."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.repository.cloud import RepositoryRoots
from conveyor.router.repository.cloud.azure_blob import AzureRepository
from conveyor.router.repository.cloud.credentials import credential_fields, credential_file_entry
from conveyor.router.repository.cloud.gcs import GcsRepository
from conveyor.router.repository.cloud.mirror import ObjectMirror, Stamp
from conveyor.router.repository.cloud.s3 import S3Repository

LEVEL = "unit"


class MemoryStore(ObjectMirror):
    def __init__(self, local: str) -> None:
        super().__init__("mem://b/repo", "repo", local)
        self.objects: dict[str, bytes] = {}
        self.downloads: list[str] = []
        self.fail = False

    def list_objects(self, prefix: str) -> dict[str, Stamp]:
        if self.fail:
            raise OSError("store unreachable")
        return {k: (len(v), str(hash(v))) for k, v in self.objects.items() if k.startswith(prefix)}

    def download(self, key: str, dest: str) -> None:
        self.downloads.append(key)
        Path(dest).write_bytes(self.objects[key])

    def object_url(self, key: str) -> str:
        return f"mem://b/{key}"


def test_sync_downloads_only_what_changed_and_prunes(tmp_path: Path) -> None:
    store = MemoryStore(str(tmp_path / "m"))
    store.objects = {"repo/a/config.pbtxt": b"one", "repo/a/1/model.onnx": b"x" * 10, "repo/b/": b"",
                     "other/ignored": b"no"}
    local = Path(store.sync())
    assert sorted(store.downloads) == ["repo/a/1/model.onnx", "repo/a/config.pbtxt"]
    assert (local / "a/config.pbtxt").read_bytes() == b"one"
    assert not (local / "b").exists()  # folder markers are not files

    store.downloads.clear()
    store.objects["repo/a/config.pbtxt"] = b"two!"
    store.sync()
    assert store.downloads == ["repo/a/config.pbtxt"]
    assert (local / "a/config.pbtxt").read_bytes() == b"two!"

    del store.objects["repo/a/1/model.onnx"]
    store.sync()
    assert not (local / "a/1").exists()  # the file and its emptied folder
    assert not [p for p in local.rglob(".part-*")]


def test_a_failed_listing_keeps_the_mirror(tmp_path: Path) -> None:
    store = MemoryStore(str(tmp_path / "m"))
    store.objects = {"repo/a/config.pbtxt": b"one"}
    store.sync()
    store.fail = True
    with pytest.raises(ConveyorError) as err:
        store.sync()
    assert err.value.status == Status.UNAVAILABLE and "cannot list mem://b/repo" in err.value.message
    assert (tmp_path / "m/a/config.pbtxt").exists()


def test_a_key_that_escapes_the_repository_is_refused(tmp_path: Path) -> None:
    store = MemoryStore(str(tmp_path / "m"))
    store.objects = {"repo/../../etc/passwd": b"x"}
    with pytest.raises(ConveyorError, match="escapes the repository"):
        store.sync()


def test_urls_map_to_their_store_and_cache_folder(tmp_path: Path) -> None:
    roots = RepositoryRoots(["/local", "s3://10.0.0.1:9000/bkt/p/q", "gs://bkt/models/", "as://acct/ctr/m"],
                            str(tmp_path))
    s3, gs, az = roots.remote
    assert isinstance(s3, S3Repository)
    assert (s3.endpoint, s3.bucket, s3.prefix) == ("http://10.0.0.1:9000", "bkt", "p/q")
    assert isinstance(gs, GcsRepository) and (gs.bucket, gs.prefix) == ("bkt", "models")
    assert isinstance(az, AzureRepository) and (az.account, az.container, az.prefix) == ("acct", "ctr", "m")
    assert roots.local == ["/local", *(os.path.join(str(tmp_path), *p) for p in (
        ("s3", "10.0.0.1", "bkt", "p/q"), ("gs", "bkt", "models"), ("as", "acct", "ctr", "m")))]


@pytest.mark.parametrize("url", ["gs://", "as://acct", "as://acct/", "s3://"])
def test_malformed_urls_are_refused(url: str, tmp_path: Path) -> None:
    with pytest.raises(ConveyorError) as err:
        RepositoryRoots([url], str(tmp_path))
    assert err.value.status == Status.INVALID_ARG


def test_unknown_scheme_is_unsupported(tmp_path: Path) -> None:
    with pytest.raises(ConveyorError) as err:
        RepositoryRoots(["hdfs://nn/models"], str(tmp_path))
    assert err.value.status == Status.UNSUPPORTED
    assert "s3://, gs://, as:// and local paths are" in err.value.message


def test_credential_file_longest_prefix_per_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({
        "gs": {"": "/keys/default.json", "gs://special": "/keys/special.json"},
        "as": {"": {"account_str": "acct", "account_key": "k1"}, "as://acct/private": {"account_key": "k2"}},
    }))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(creds))
    assert credential_file_entry("gs", "gs://special/models") == "/keys/special.json"
    assert credential_file_entry("gs", "gs://other/models") == "/keys/default.json"
    assert credential_fields("as", "as://acct/private/m") == {"account_key": "k2"}
    assert credential_fields("as", "as://acct/public/m") == {"account_str": "acct", "account_key": "k1"}
    assert credential_fields("s3", "s3://b/m") == {}
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH")
    assert credential_file_entry("gs", "gs://special/models") is None
