"""A gRPC server written on the event loop (HTTP/2 over plaintext TCP), without grpcio's
per-call machinery: the same servicers, the same method tables.

Modules: ``frames`` (HTTP/2 frame constants and writers), ``header_block``
(HPACK in and out), ``context`` (what a servicer sees of its call), ``stream``
(one call's state), ``connection`` (the protocol: reading, flow control,
running calls, writing), ``server`` (listening and stopping).
"""
