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
    # Conveyor's own: a client's mistake that Triton reports as INTERNAL (a model its repository does not
    # hold, a malformed shape, an unopenable shared-memory key). Rendered as Triton does (500 / INTERNAL)
    # since Triton's clients and QA assert it; 400 / INVALID_ARGUMENT with --client-mistakes-as-400.
    CLIENT_MISTAKE = 9


# Triton's HTTP mapping (server docs/protocol/README.md): everything else is 400.
_HTTP_STATUS = {
    Status.INTERNAL: 500,
    Status.CLIENT_MISTAKE: 500,
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
    Status.CLIENT_MISTAKE: "INTERNAL",
}


def client_mistakes_as_400(on: bool) -> None:
    """Render ``Status.CLIENT_MISTAKE`` as 400 / INVALID_ARGUMENT (``--client-mistakes-as-400``) instead
    of Triton's 500 / INTERNAL. Called once by an ingress at its start, before it answers anything."""
    _HTTP_STATUS[Status.CLIENT_MISTAKE] = 400 if on else 500
    _GRPC_CODE[Status.CLIENT_MISTAKE] = "INVALID_ARGUMENT" if on else "INTERNAL"


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


class WorkerLost(ConveyorError):
    """UNAVAILABLE: the worker running the request exited under it (the router's ``ErrorInfo.worker_lost``).
    Not the request's fault: the OpenAI ingress may send it again (``ingress/openai/migration.py``)."""

    def __init__(self, message: str) -> None:
        super().__init__(Status.UNAVAILABLE, message)


# Triton's names of its codes (TRITONSERVER_ErrorCodeString; "<invalid code>" for the others), as its
# command line prints an error.
_TRITON_CODE_NAME = {
    Status.UNKNOWN: "Unknown",
    Status.INTERNAL: "Internal",
    Status.NOT_FOUND: "Not found",
    Status.INVALID_ARG: "Invalid argument",
    Status.UNAVAILABLE: "Unavailable",
    Status.UNSUPPORTED: "Unsupported",
    Status.ALREADY_EXISTS: "Already exists",
    Status.CLIENT_MISTAKE: "Internal",
}


def triton_line(what: str, err: ConveyorError) -> str:
    """An error as Triton's ``tritonserver`` prints one it exits on (``FAIL_IF_ERR`` in its main.cc):
    ``error: creating server: Internal - failed to stat file /models``."""
    return f"error: {triton_log_line(what, err)}"


def triton_log_line(what: str, err: ConveyorError) -> str:
    """An error as Triton's ``LOG_TRITONSERVER_ERROR`` logs it:
    ``failed to start Vertex AI service: Invalid argument - Expect the default model 'm' is loaded``."""
    return f"{what}: {_TRITON_CODE_NAME.get(err.status, '<invalid code>')} - {err.message}"


def triton_status_text(err: ConveyorError) -> str:
    """An error as Triton's ``Status::AsString`` writes it in a log line: ``Internal: failed to stat file /m``."""
    return f"{_TRITON_CODE_NAME.get(err.status, '<invalid code>')}: {err.message}"


def triton_code(status: int) -> int:
    """The TRITONSERVER_Error_Code a Python model's ``TritonError.code()`` shows for ``status``."""
    return int(Status.INTERNAL) if status == Status.CLIENT_MISTAKE else status


def client_mistake(message: str) -> ConveyorError:
    """A client's mistake that Triton reports as INTERNAL (``Status.CLIENT_MISTAKE``)."""
    return ConveyorError(Status.CLIENT_MISTAKE, message)


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
