"""A gRPC server written on the event loop (HTTP/2 over plaintext TCP), without grpcio's
per-call machinery: the same servicers, the same method tables.

Modules: ``frames`` (HTTP/2 frame constants and writers), ``header_block``
(HPACK in and out), ``messages`` (gRPC's length-prefixed messages out of
DATA), ``context`` (what a servicer sees of its call), ``stream`` (one call's
state), ``connection`` (the protocol: reading, control frames, streams'
lives), ``outbound`` (writing: the buffer, the client's windows, answers),
``calls`` (running a servicer method), ``server`` (listening and stopping).
"""
