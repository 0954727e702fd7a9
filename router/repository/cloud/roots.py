"""The ``--model-repository`` roots as local directories: remote ones become mirrors in a cache."""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from collections.abc import Callable

from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.repository.cloud.azure_blob import AzureRepository
from conveyor.router.repository.cloud.gcs import GcsRepository
from conveyor.router.repository.cloud.mirror import ObjectMirror
from conveyor.router.repository.cloud.s3 import S3Repository

log = logging.getLogger(__name__)

CACHE_ENV = "CONVEYOR_REPOSITORY_CACHE"
# scheme -> parse(url, cache_dir): the mirror of that root
STORES: dict[str, Callable[[str, str], ObjectMirror]] = {
    "s3": S3Repository.parse,
    "gs": GcsRepository.parse,
    "as": AzureRepository.parse,
}


def is_remote(root: str) -> bool:
    return "://" in root


class UnusableRepository(ConveyorError):
    """A ``--model-repository`` root that Triton refuses to create a server with: one it cannot stat
    (missing, or behind a folder it may not search; a bucket or container that does not exist or cannot
    be listed), or one that is no folder (a file; a bucket path that holds no object). Whatever
    ``--exit-on-error`` says, the server does not start (Triton's ``ModelRepositoryManager::Create``)."""


def local_root_problem(root: str) -> UnusableRepository | None:
    """Triton's check of a local root, in its words: a root it cannot stat, or one that is not a folder."""
    try:
        mode = os.stat(root).st_mode
    except OSError:
        return UnusableRepository(Status.INTERNAL, f"failed to stat file {root}")
    if not stat.S_ISDIR(mode):
        return UnusableRepository(Status.INVALID_ARG, "repository path is not a valid directory")
    return None


class RepositoryRoots:
    """The ``--model-repository`` roots as local directories, syncing remote ones."""

    def __init__(self, roots: list[str], cache_dir: str = "") -> None:
        cache = cache_dir or os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), "conveyor-repo-cache")
        self.roots = list(dict.fromkeys(roots))  # as given; one given twice is one root (Triton's set of paths)
        self.remote: list[ObjectMirror] = []
        self.local: list[str] = []
        for root in self.roots:
            if not is_remote(root):
                self.local.append(root)
                continue
            scheme = root.split("://", 1)[0]
            parse = STORES.get(scheme)
            if parse is None:
                raise ConveyorError(
                    Status.UNSUPPORTED,
                    f"'{root}': {scheme}:// repositories are not supported (s3://, gs://, as:// and local paths are)",
                )
            repo = parse(root, cache)
            self.remote.append(repo)
            self.local.append(repo.local)

    def check(self, remote: bool = True) -> None:
        """Raise ``UnusableRepository`` for the first root Triton would refuse to start with, in the order
        Triton checks them (its set of roots: sorted). A remote root is listed, unless ``remote`` is false
        (nothing is downloaded): a store that cannot be listed (no such bucket, no access, no client
        library) or a path under which it holds nothing."""
        mirrors = {repo.local: repo for repo in self.remote}
        for given, local in sorted(zip(self.roots, self.local, strict=True)):
            repo = mirrors.get(local)
            if repo is None:
                problem = local_root_problem(given)
                if problem is not None:
                    raise problem
                continue
            if not remote:
                continue
            try:
                held = repo.list_objects(f"{repo.prefix}/" if repo.prefix else "")
            except ConveyorError as exc:
                raise UnusableRepository(Status.INTERNAL, exc.message) from None
            except Exception as exc:
                raise UnusableRepository(Status.INTERNAL, f"cannot list {given}: {exc}") from None
            if repo.prefix and not held:
                raise UnusableRepository(Status.INVALID_ARG, "repository path is not a valid directory")

    def sync(self) -> None:
        """Refresh every remote mirror; a failure leaves the last good mirror in place."""
        for repo in self.remote:
            try:
                repo.sync()
            except ConveyorError as exc:
                log.error("%s", exc.message)
