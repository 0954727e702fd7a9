"""The gRPC server on the event loop: gRPC's mapping onto HTTP/2, over python-hyper's
sans-IO h2 (frames, HPACK, flow control and stream states are h2's), without grpcio's
per-call machinery: the same servicers, the same method tables.

Modules: ``connection`` (the asyncio protocol driving ``h2.connection.H2Connection``,
and the limits each HTTP/2 attack meets), ``outbound`` (answers within the client's
windows, h2's output written once per loop turn), ``messages`` (gRPC's length-prefixed
messages out of DATA; the buffer budgets), ``metadata`` (request headers read,
response headers and trailers), ``context`` (what a servicer sees of its call),
``stream`` (one call's state), ``calls`` (running a servicer method), ``server``
(listening and stopping).
"""
