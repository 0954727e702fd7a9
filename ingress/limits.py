"""What one ingress process accepts: the limits a client meets before any model runs.

Each has a safe default and a flag (``deploy/settings.py``); docs/SECURITY.md lists
them with what a client sees when it is over one.
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.ingress.header_forward import HeaderForward
from conveyor.proto.errors import ConveyorError, invalid_arg, unavailable

# An HTTP request body (--http-max-body-bytes): 1 GiB, the largest tensor Triton's own HTTP front
# accepts in one request. Here rather than in http/body.py so the settings (deploy/settings.py),
# which every actor imports, need not import falcon.
DEFAULT_MAX_BODY_BYTES = 1 << 30
# 2^30 elements: a 1 GiB INT8/BOOL tensor, as large as the default HTTP body limit allows.
DEFAULT_MAX_INPUT_ELEMENTS = 1 << 30
# Requests one ingress process holds at once (HTTP and gRPC alike); the router
# queues each model version up to --max-queue-size on top of this.
DEFAULT_MAX_INFLIGHT = 4096
# JSON tensors cost a Python object per number (up to ~8x the text in memory):
# past this, a client is told to send tensors with the binary extension.
DEFAULT_MAX_JSON_BYTES = 64 << 20
# The gRPC server on h2 (ingress/grpc/h2_server): bytes of request messages held before their call
# takes them (messages still arriving, a unary call's message before its END_STREAM, a streaming
# call's messages its handler has not taken), per ingress process and per connection. Stops
# messages that declare gigabytes and send them slowly, on many streams and connections: a message
# grows only with the bytes that arrived, and the stream whose bytes go past a budget ends with
# RESOURCE_EXHAUSTED; a message larger than the connection's budget is refused at its prefix.
# 1 GiB per connection is the HTTP ingress's body limit. Flags: --grpc-max-buffer-bytes,
# --grpc-max-connection-buffer-bytes.
DEFAULT_GRPC_BUFFER_BYTES = 2 << 30
DEFAULT_GRPC_CONNECTION_BUFFER_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class IngressLimits:
    """``0`` turns a limit off."""

    max_input_elements: int = DEFAULT_MAX_INPUT_ELEMENTS
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
    # --http-header-forward-pattern / --grpc-header-forward-pattern, whichever this
    # process serves; None: no header is read for it.
    header_forward: HeaderForward | None = None


def check_json_size(nbytes: int, limit: int) -> None:
    if limit and nbytes > limit:
        raise json_too_large(nbytes, limit)


def json_too_large(nbytes: int, limit: int, flag: str = "--max-json-bytes") -> ConveyorError:
    # Triton's words, then which of ``conveyor serve``'s flags sets this limit.
    return invalid_arg(
        f"request JSON size of {nbytes} bytes exceeds the maximum allowed input size of {limit} bytes. "
        f"Use --http-max-input-size to increase the limit. (conveyor serve: {flag}; or send large tensors "
        "with the binary tensor extension or shared memory)"
    )


def too_many_in_flight(limit: int) -> ConveyorError:
    return unavailable(
        f"too many requests in flight: this ingress process serves at most {limit} at once "
        "(--max-inflight-requests); retry later"
    )
