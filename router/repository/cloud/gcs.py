"""``gs://bucket/path``, via google-cloud-storage.

Credentials, as Triton: the credential file's ``"gs"`` section (its value is the
path of a service-account JSON file), else Google's default chain
(``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's application-default login, the
metadata server). With none found the bucket is read anonymously, which works
for public buckets. ``STORAGE_EMULATOR_HOST`` (honoured by the client library)
points everything at an emulator instead.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.repository.cloud.credentials import credential_file_entry
from conveyor.router.repository.cloud.mirror import ObjectMirror, Stamp, missing_library

log = logging.getLogger(__name__)

_URL = re.compile(r"^gs://(?P<bucket>[^/]+)/?(?P<prefix>.*)$")


class GcsRepository(ObjectMirror):
    def __init__(self, url: str, bucket: str, prefix: str, local: str) -> None:
        super().__init__(url, prefix, local)
        self.bucket = bucket

    @classmethod
    def parse(cls, url: str, cache_dir: str) -> GcsRepository:
        m = _URL.match(url)
        if m is None:
            raise ConveyorError(Status.INVALID_ARG, f"'{url}' is not a gs://bucket/path URL")
        prefix = m["prefix"].strip("/")
        return cls(url, m["bucket"], prefix, os.path.join(cache_dir, "gs", m["bucket"], prefix))

    def _make_client(self) -> Any:
        try:
            from google.auth.exceptions import DefaultCredentialsError
            from google.cloud import storage
        except ImportError:
            raise missing_library("gs", "google-cloud-storage") from None
        key_file = credential_file_entry("gs", self.url)
        if isinstance(key_file, str) and key_file:
            return storage.Client.from_service_account_json(key_file)
        try:
            return storage.Client()
        except DefaultCredentialsError:
            log.warning("%s: no Google credentials found, reading the bucket anonymously", self.url)
            return storage.Client.create_anonymous_client()

    def list_objects(self, prefix: str) -> dict[str, Stamp]:
        return {
            blob.name: (int(blob.size or 0), str(blob.md5_hash or blob.etag or ""))
            for blob in self.client().list_blobs(self.bucket, prefix=prefix)
        }

    def download(self, key: str, dest: str) -> None:
        self.client().bucket(self.bucket).blob(key).download_to_filename(dest)

    def object_url(self, key: str) -> str:
        return f"gs://{self.bucket}/{key}"
