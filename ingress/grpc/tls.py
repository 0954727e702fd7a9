"""gRPC over TLS with Triton's flags: ``--grpc-use-ssl``, ``--grpc-use-ssl-mutual``,
``--grpc-server-cert``, ``--grpc-server-key``, ``--grpc-root-cert`` (PEM files).

With mutual TLS the server asks for a client certificate and accepts only
those signed by the root certificate. The same files make grpcio's credentials
(``credentials``) and the event loop's server's ``ssl.SSLContext`` (``ssl_context``)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

import grpc

# The one application protocol served: gRPC clients offer it in ALPN and gRPC core's server refuses a
# handshake that did not select it (RFC 9113 §3.2: h2 over TLS is negotiated by ALPN).
ALPN_H2 = "h2"
# Oldest TLS version accepted: gRPC core's own minimum; RFC 9113 §9.2 asks HTTP/2 for TLS 1.2 or later.
MIN_TLS_VERSION = ssl.TLSVersion.TLSv1_2


@dataclass(frozen=True, slots=True)
class GrpcTls:
    server_cert: str
    server_key: str
    root_cert: str = ""
    mutual: bool = False

    def _check(self) -> None:
        if self.mutual and not self.root_cert:
            raise ValueError("--grpc-use-ssl-mutual needs --grpc-root-cert: the CA that signs client certificates")

    def credentials(self) -> Any:
        """``grpc.ServerCredentials`` from the PEM files; OSError/ValueError when unusable."""
        self._check()
        with open(self.server_key, "rb") as f:
            key = f.read()
        with open(self.server_cert, "rb") as f:
            cert = f.read()
        root = None
        if self.root_cert:
            with open(self.root_cert, "rb") as f:
                root = f.read()
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=root, require_client_auth=self.mutual)

    def ssl_context(self) -> ssl.SSLContext:
        """The server's ``ssl.SSLContext`` for the same files and policy as ``credentials``: TLS 1.2 or
        later, ALPN h2 only, and with ``mutual`` a client certificate signed by the root certificate
        required (as grpcio, a root certificate without ``mutual`` asks for none);
        ssl.SSLError/OSError/ValueError when unusable."""
        self._check()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = MIN_TLS_VERSION
        # Client-initiated renegotiation costs the server a handshake per request of the client's (a CPU
        # flood); gRPC core's TLS library (BoringSSL) refuses it too.
        ctx.options |= ssl.OP_NO_RENEGOTIATION
        ctx.load_cert_chain(self.server_cert, self.server_key)
        ctx.set_alpn_protocols([ALPN_H2])
        if self.mutual:
            ctx.load_verify_locations(cafile=self.root_cert)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx
