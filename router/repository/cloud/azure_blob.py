"""``as://account/container/path`` (Triton's Azure Storage URL), via azure-storage-blob.

Credentials, in this order:

1. the credential file's ``"as"`` section: ``{"account_str", "account_key"}``;
2. ``AZURE_STORAGE_CONNECTION_STRING`` (the Azure SDK's convention): its account,
   key and endpoint are used as they are, which is how an emulator such as
   Azurite is reached;
3. ``AZURE_STORAGE_ACCOUNT`` and ``AZURE_STORAGE_KEY``, as Triton;
4. none: the container is read anonymously (public containers).

For 1 and 3 the endpoint is ``https://{account}.blob.core.windows.net``, or the
template in ``CONVEYOR_AZURE_BLOB_ENDPOINT`` (``{account}`` is replaced), e.g.
``http://127.0.0.1:10000/{account}`` for Azurite.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.repository.cloud.credentials import credential_fields
from conveyor.router.repository.cloud.mirror import ObjectMirror, Stamp, missing_library

_URL = re.compile(r"^as://(?P<account>[^/]+)/(?P<container>[^/]+)/?(?P<prefix>.*)$")
ENDPOINT_ENV = "CONVEYOR_AZURE_BLOB_ENDPOINT"
DEFAULT_ENDPOINT = "https://{account}.blob.core.windows.net"

# The SDK logs every HTTP request and response at INFO: a poll would flood the router's log.
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)


class AzureRepository(ObjectMirror):
    def __init__(self, url: str, account: str, container: str, prefix: str, local: str) -> None:
        super().__init__(url, prefix, local)
        self.account = account
        self.container = container

    @classmethod
    def parse(cls, url: str, cache_dir: str) -> AzureRepository:
        m = _URL.match(url)
        if m is None:
            raise ConveyorError(Status.INVALID_ARG, f"'{url}' is not an as://account/container/path URL")
        prefix = m["prefix"].strip("/")
        local = os.path.join(cache_dir, "as", m["account"], m["container"], prefix)
        return cls(url, m["account"], m["container"], prefix, local)

    def _make_client(self) -> Any:
        try:
            from azure.storage.blob import BlobServiceClient
        except ImportError:
            raise missing_library("as", "azure-storage-blob") from None
        creds = credential_fields("as", self.url)
        connection_string = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
        if not creds and connection_string:
            service = BlobServiceClient.from_connection_string(connection_string)
        else:
            if not creds:
                creds = {"account_str": os.environ.get("AZURE_STORAGE_ACCOUNT", ""),
                         "account_key": os.environ.get("AZURE_STORAGE_KEY", "")}
            account = creds.get("account_str") or self.account
            credential = {"account_name": account, "account_key": creds["account_key"]} \
                if creds.get("account_key") else None
            endpoint = (os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT).format(account=self.account)
            service = BlobServiceClient(endpoint, credential=credential)
        return service.get_container_client(self.container)

    def list_objects(self, prefix: str) -> dict[str, Stamp]:
        return {
            blob.name: (int(blob.size or 0), str(blob.etag or ""))
            for blob in self.client().list_blobs(name_starts_with=prefix)
        }

    def download(self, key: str, dest: str) -> None:
        with open(dest, "wb") as f:
            self.client().download_blob(key).readinto(f)

    def object_url(self, key: str) -> str:
        return f"as://{self.account}/{self.container}/{key}"
