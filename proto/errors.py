"""Errors as values with a status, shared by every actor.

Hierarchy::

    ConveyorError(status, message)        raised where the fault is known
      status: Status                      Triton's status codes
        -> http_status(status)            rendered once, by the HTTP ingress
        -> grpc_code(status)              rendered once, by the gRPC ingress

Actors never format protocol errors themselves: they raise or return a
``ConveyorError`` and the ingress renders it in its protocol's form
(``{"error": msg}`` + HTTP status, or a gRPC status + message).
"""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """Triton's error codes (TRITONSERVER_Error_Code), plus the overload case."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7
    DEADLINE_EXCEEDED = 8


# Triton's HTTP mapping (server docs/protocol/README.md): everything else is 400.
_HTTP_STATUS = {
    Status.INTERNAL: 500,
    Status.NOT_FOUND: 404,
    Status.UNAVAILABLE: 503,
    Status.UNSUPPORTED: 501,
}

# grpc.StatusCode names, kept as strings so this module does not import grpc.
_GRPC_CODE = {
    Status.UNKNOWN: "UNKNOWN",
    Status.INTERNAL: "INTERNAL",
    Status.NOT_FOUND: "NOT_FOUND",
    Status.INVALID_ARG: "INVALID_ARGUMENT",
    Status.UNAVAILABLE: "UNAVAILABLE",
    Status.UNSUPPORTED: "UNIMPLEMENTED",
    Status.ALREADY_EXISTS: "ALREADY_EXISTS",
    Status.CANCELLED: "CANCELLED",
    Status.DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
}


def http_status(status: Status) -> int:
    return _HTTP_STATUS.get(status, 400)


def grpc_code_name(status: Status) -> str:
    return _GRPC_CODE[status]


class ConveyorError(Exception):
    """A failure with a Triton status; ``str(err)`` is the client-facing message."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __repr__(self) -> str:
        return f"ConveyorError({self.status.name}, {self.message!r})"


def invalid_arg(message: str) -> ConveyorError:
    return ConveyorError(Status.INVALID_ARG, message)


def not_found(message: str) -> ConveyorError:
    return ConveyorError(Status.NOT_FOUND, message)


def unavailable(message: str) -> ConveyorError:
    return ConveyorError(Status.UNAVAILABLE, message)


def internal(message: str) -> ConveyorError:
    return ConveyorError(Status.INTERNAL, message)


def unsupported(message: str) -> ConveyorError:
    return ConveyorError(Status.UNSUPPORTED, message)


def request_prefix(request_id: str) -> str:
    """Triton's ``InferenceRequest::LogRequest()``: the start of the messages of the
    checks Triton's core makes on a request (its shape, types, sizes; a full queue)."""
    return f"[request id: {request_id or '<id_unknown>'}] "
