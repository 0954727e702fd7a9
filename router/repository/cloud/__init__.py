"""Model repositories in object storage (``s3://``, ``gs://``, ``as://``), mirrored into a local cache."""

from conveyor.router.repository.cloud.roots import CACHE_ENV, RepositoryRoots, is_remote

__all__ = ["CACHE_ENV", "RepositoryRoots", "is_remote"]
