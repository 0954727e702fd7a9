"""gRPC over TLS with Triton's flags: ``--grpc-use-ssl``, ``--grpc-use-ssl-mutual``,
``--grpc-server-cert``, ``--grpc-server-key``, ``--grpc-root-cert`` (PEM files).

With mutual TLS the server asks for a client certificate and accepts only
those signed by the root certificate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc


@dataclass(frozen=True, slots=True)
class GrpcTls:
    server_cert: str
    server_key: str
    root_cert: str = ""
    mutual: bool = False

    def credentials(self) -> Any:
        """``grpc.ServerCredentials`` from the PEM files; OSError/ValueError when unusable."""
        if self.mutual and not self.root_cert:
            raise ValueError("--grpc-use-ssl-mutual needs --grpc-root-cert: the CA that signs client certificates")
        with open(self.server_key, "rb") as f:
            key = f.read()
        with open(self.server_cert, "rb") as f:
            cert = f.read()
        root = None
        if self.root_cert:
            with open(self.root_cert, "rb") as f:
                root = f.read()
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=root, require_client_auth=self.mutual)
