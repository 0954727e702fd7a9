"""The mirror every object store shares: list, download what changed, rename into place, prune.

A store subclass only lists ``key -> (size, etag or md5)`` under its prefix and
downloads one key to a path; everything about the local tree lives here, so the
three stores behave the same way on disk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from abc import ABC, abstractmethod
from typing import Any

from conveyor.proto.errors import ConveyorError, Status

log = logging.getLogger(__name__)

Stamp = tuple[int, str]  # (size, etag or md5): a change in either means download again


def missing_library(scheme: str, package: str) -> ConveyorError:
    """The error for a repository URL whose client library is not installed."""
    return ConveyorError(Status.UNAVAILABLE, f"{scheme}:// repositories need {package}: pip install 'conveyor[cloud]'")


class ObjectMirror(ABC):
    """One remote repository root and the local directory that mirrors it."""

    def __init__(self, url: str, prefix: str, local: str) -> None:
        self.url = url
        self.prefix = prefix.strip("/")
        self.local = local
        self._seen: dict[str, Stamp] = {}  # key -> stamp of what the local file holds
        self._client: Any = None

    def client(self) -> Any:
        """The store's client library object, built on first use (a sync may never run)."""
        if self._client is None:
            self._client = self._make_client()
        return self._client

    def _make_client(self) -> Any:
        """Build the client with the store's credential conventions; raise ``missing_library`` without it."""
        raise NotImplementedError(f"{type(self).__name__} has no client")

    @abstractmethod
    def list_objects(self, prefix: str) -> dict[str, Stamp]:
        """Every object under ``prefix`` (folder markers excluded); raise on failure."""

    @abstractmethod
    def download(self, key: str, dest: str) -> None:
        """Write object ``key`` to the file ``dest``; raise on failure."""

    @abstractmethod
    def object_url(self, key: str) -> str:
        """``key`` as a URL of this store, for messages."""

    def sync(self) -> str:
        """Mirror the remote path into ``local``; returns ``local``."""
        prefix = f"{self.prefix}/" if self.prefix else ""
        try:
            remote = {k: v for k, v in self.list_objects(prefix).items() if not k.endswith("/")}
        except ConveyorError:
            raise
        except Exception as exc:
            raise ConveyorError(Status.UNAVAILABLE, f"cannot list {self.url}: {exc}") from None
        os.makedirs(self.local, exist_ok=True)
        fetched = 0
        for key, stamp in remote.items():
            path = self._local_path(key, prefix)
            if self._seen.get(key) == stamp and os.path.exists(path):
                continue
            self._fetch(key, path)
            self._seen[key] = stamp
            fetched += 1
        removed = self._prune({self._local_path(k, prefix) for k in remote})
        for key in set(self._seen) - set(remote):
            del self._seen[key]
        if fetched or removed:
            log.info("%s: %d file(s) fetched, %d removed", self.url, fetched, removed)
        return self.local

    def _fetch(self, key: str, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # Download beside the target, then rename: a scan never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".part-")
        os.close(fd)
        try:
            self.download(key, tmp)
            os.replace(tmp, path)
        except Exception as exc:
            with contextlib.suppress(FileNotFoundError):  # some clients delete a failed download themselves
                os.unlink(tmp)
            raise ConveyorError(Status.UNAVAILABLE, f"cannot fetch {self.object_url(key)}: {exc}") from None

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
                with contextlib.suppress(OSError):  # only when empty
                    os.rmdir(os.path.join(root, d))
        return removed
