"""Triton's Python-backend error types, as model code sees them."""

from __future__ import annotations


class TritonError:
    """An error a model puts in an ``InferenceResponse``: fails that one request.

    Like Triton's, it is a value, not an exception; ``code`` is one of the class
    constants (Triton's TRITONSERVER_Error_Code numbering, which Conveyor's
    ``Status`` shares).
    """

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class TritonModelException(Exception):
    """Raised by the utilities on misuse; a model may raise it from ``execute`` too."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    def message(self) -> str:
        return self._message
