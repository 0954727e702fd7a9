"""Model repositories in object storage, mirrored into a local cache directory.

``s3://bucket/path`` and ``s3://host:port/bucket/path`` (a custom endpoint, as
Triton accepts) are synced with boto3 before the router scans and, in poll
mode, before each poll; workers then load from the local mirror. Only objects
whose size or ETag changed are downloaded again; local files whose object is
gone are deleted, so a model removed from the bucket disappears from the
mirror too.

Credentials follow Triton's conventions: boto3's own chain (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``, profiles)
or the JSON file named by ``TRITON_CLOUD_CREDENTIAL_PATH``
(``{"s3": {"": {"key_id", "secret_key", "session_token", "region"}}}``, keyed by
path prefix; the longest matching prefix wins).
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any

from conveyor.proto.errors import ConveyorError, Status

log = logging.getLogger(__name__)

CACHE_ENV = "CONVEYOR_REPOSITORY_CACHE"
_S3 = re.compile(r"^s3://(?:(?P<host>[^/:]+):(?P<port>\d+)/)?(?P<bucket>[^/]+)/?(?P<prefix>.*)$")


def is_remote(root: str) -> bool:
    return "://" in root


@dataclass
class S3Repository:
    url: str
    bucket: str
    prefix: str
    endpoint: str = ""
    local: str = ""
    _seen: dict[str, tuple[int, str]] = field(default_factory=dict)  # key -> (size, etag) mirrored

    @classmethod
    def parse(cls, url: str, cache_dir: str) -> S3Repository:
        m = _S3.match(url)
        if m is None:
            raise ConveyorError(Status.INVALID_ARG, f"'{url}' is not an s3://[host:port/]bucket/path URL")
        endpoint = f"http://{m['host']}:{m['port']}" if m["host"] else ""
        prefix = m["prefix"].strip("/")
        local = os.path.join(cache_dir, "s3", m["host"] or "aws", m["bucket"], prefix)
        return cls(url, m["bucket"], prefix, endpoint, local)

    def _client(self) -> Any:
        try:
            import boto3
        except ImportError:
            raise ConveyorError(
                Status.UNAVAILABLE, "s3:// repositories need boto3: pip install 'conveyor[cloud]'"
            ) from None
        kwargs: dict[str, Any] = {}
        if self.endpoint:
            kwargs["endpoint_url"] = self.endpoint
        creds = _credential_file_entry("s3", self.url)
        if creds:
            kwargs.update(
                aws_access_key_id=creds.get("key_id") or None,
                aws_secret_access_key=creds.get("secret_key") or None,
                aws_session_token=creds.get("session_token") or None,
                region_name=creds.get("region") or None,
            )
        return boto3.client("s3", **kwargs)

    def sync(self) -> str:
        """Mirror the bucket path into ``local``; returns ``local``."""
        client = self._client()
        prefix = f"{self.prefix}/" if self.prefix else ""
        remote: dict[str, tuple[int, str]] = {}
        try:
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    key = obj["Key"]
                    if not key.endswith("/"):
                        remote[key] = (int(obj["Size"]), str(obj.get("ETag", "")))
        except Exception as exc:
            raise ConveyorError(Status.UNAVAILABLE, f"cannot list {self.url}: {exc}") from None
        os.makedirs(self.local, exist_ok=True)
        fetched = 0
        for key, stamp in remote.items():
            path = self._local_path(key, prefix)
            if self._seen.get(key) == stamp and os.path.exists(path):
                continue
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # Download beside the target, then rename: a scan never sees half a file.
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".part-")
            os.close(fd)
            try:
                client.download_file(self.bucket, key, tmp)
                os.replace(tmp, path)
            except Exception as exc:
                os.unlink(tmp)
                raise ConveyorError(Status.UNAVAILABLE, f"cannot fetch s3://{self.bucket}/{key}: {exc}") from None
            self._seen[key] = stamp
            fetched += 1
        removed = self._prune({self._local_path(k, prefix) for k in remote})
        for key in set(self._seen) - set(remote):
            del self._seen[key]
        if fetched or removed:
            log.info("%s: %d file(s) fetched, %d removed", self.url, fetched, removed)
        return self.local

    def _local_path(self, key: str, prefix: str) -> str:
        rel = key[len(prefix):]
        path = os.path.normpath(os.path.join(self.local, rel))
        if not path.startswith(os.path.normpath(self.local) + os.sep):
            raise ConveyorError(Status.INVALID_ARG, f"object key '{key}' escapes the repository")
        return path

    def _prune(self, keep: set[str]) -> int:
        removed = 0
        for root, dirs, files in os.walk(self.local, topdown=False):
            for f in files:
                path = os.path.join(root, f)
                if path not in keep:
                    os.unlink(path)
                    removed += 1
            for d in dirs:
                try:
                    os.rmdir(os.path.join(root, d))  # only when empty
                except OSError:
                    pass
        return removed


class RepositoryRoots:
    """The ``--model-repository`` roots as local directories, syncing remote ones."""

    def __init__(self, roots: list[str], cache_dir: str = "") -> None:
        cache = cache_dir or os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), "conveyor-repo-cache")
        self.remote: list[S3Repository] = []
        self.local: list[str] = []
        for root in roots:
            if not is_remote(root):
                self.local.append(root)
            elif root.startswith("s3://"):
                repo = S3Repository.parse(root, cache)
                self.remote.append(repo)
                self.local.append(repo.local)
            else:
                scheme = root.split("://", 1)[0]
                raise ConveyorError(
                    Status.UNSUPPORTED,
                    f"'{root}': {scheme}:// repositories are not supported yet (s3:// and local paths are)",
                )

    def sync(self) -> None:
        """Refresh every remote mirror; a failure leaves the last good mirror in place."""
        for repo in self.remote:
            try:
                repo.sync()
            except ConveyorError as exc:
                log.error("%s", exc.message)


def _credential_file_entry(kind: str, url: str) -> dict[str, str]:
    path = os.environ.get("TRITON_CLOUD_CREDENTIAL_PATH", "")
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        log.error("cannot read TRITON_CLOUD_CREDENTIAL_PATH %s: %s", path, exc)
        return {}
    entries = doc.get(kind, {}) if isinstance(doc, dict) else {}
    best = max((p for p in entries if url.startswith(p)), key=len, default=None)
    return dict(entries[best]) if best is not None else {}
