"""``s3://bucket/path`` and ``s3://host:port/bucket/path`` (a custom endpoint, as Triton accepts), via boto3.

Credentials: boto3's own chain (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``, profiles), or the credential file's
``"s3"`` section (``{"key_id", "secret_key", "session_token", "region", "profile"}``).
"""

from __future__ import annotations

import os
import re
from typing import Any

from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.repository.cloud.credentials import credential_fields
from conveyor.router.repository.cloud.mirror import ObjectMirror, Stamp, missing_library

_URL = re.compile(r"^s3://(?:(?P<host>[^/:]+):(?P<port>\d+)/)?(?P<bucket>[^/]+)/?(?P<prefix>.*)$")


class S3Repository(ObjectMirror):
    def __init__(self, url: str, bucket: str, prefix: str, endpoint: str, local: str) -> None:
        super().__init__(url, prefix, local)
        self.bucket = bucket
        self.endpoint = endpoint

    @classmethod
    def parse(cls, url: str, cache_dir: str) -> S3Repository:
        m = _URL.match(url)
        if m is None:
            raise ConveyorError(Status.INVALID_ARG, f"'{url}' is not an s3://[host:port/]bucket/path URL")
        endpoint = f"http://{m['host']}:{m['port']}" if m["host"] else ""
        prefix = m["prefix"].strip("/")
        local = os.path.join(cache_dir, "s3", m["host"] or "aws", m["bucket"], prefix)
        return cls(url, m["bucket"], prefix, endpoint, local)

    def _make_client(self) -> Any:
        try:
            import boto3
        except ImportError:
            raise missing_library("s3", "boto3") from None
        kwargs: dict[str, Any] = {}
        if self.endpoint:
            kwargs["endpoint_url"] = self.endpoint
        creds = credential_fields("s3", self.url)
        if creds.get("profile"):
            session = boto3.Session(profile_name=creds["profile"])
            return session.client("s3", **kwargs)
        if creds:
            kwargs.update(
                aws_access_key_id=creds.get("key_id") or None,
                aws_secret_access_key=creds.get("secret_key") or None,
                aws_session_token=creds.get("session_token") or None,
                region_name=creds.get("region") or None,
            )
        return boto3.client("s3", **kwargs)

    def list_objects(self, prefix: str) -> dict[str, Stamp]:
        remote: dict[str, Stamp] = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                remote[obj["Key"]] = (int(obj["Size"]), str(obj.get("ETag", "")))
        return remote

    def download(self, key: str, dest: str) -> None:
        self.client().download_file(self.bucket, key, dest)

    def object_url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"
