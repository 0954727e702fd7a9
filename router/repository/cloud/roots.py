"""The ``--model-repository`` roots as local directories: remote ones become mirrors in a cache."""

from __future__ import annotations

import logging
import os
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


class RepositoryRoots:
    """The ``--model-repository`` roots as local directories, syncing remote ones."""

    def __init__(self, roots: list[str], cache_dir: str = "") -> None:
        cache = cache_dir or os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), "conveyor-repo-cache")
        self.remote: list[ObjectMirror] = []
        self.local: list[str] = []
        for root in roots:
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

    def sync(self) -> None:
        """Refresh every remote mirror; a failure leaves the last good mirror in place."""
        for repo in self.remote:
            try:
                repo.sync()
            except ConveyorError as exc:
                log.error("%s", exc.message)
