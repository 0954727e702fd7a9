"""Model repositories in object storage (``s3://``, ``gs://``, ``as://``), mirrored into a local cache."""

from conveyor.router.repository.cloud.roots import (
    CACHE_ENV,
    RepositoryRoots,
    UnusableRepository,
    is_remote,
    local_root_problem,
)

__all__ = ["CACHE_ENV", "RepositoryRoots", "UnusableRepository", "is_remote", "local_root_problem"]
