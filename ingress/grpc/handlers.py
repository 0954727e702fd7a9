"""Method-handler tables of the generated servicers, made safe for malformed messages.

grpcio runs a method's request deserializer before the handler; when it raises
(bytes that are not a valid protobuf message), grpc answers UNKNOWN with no
word of why. Every deserializer here is wrapped instead: a message protobuf
cannot parse becomes a ``Malformed`` value, which the handler turns into
INVALID_ARGUMENT, the client's mistake it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from conveyor.proto.errors import ConveyorError, invalid_arg


class Malformed:
    """What a request deserializer returns for bytes that do not parse."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why

    def error(self, method: str) -> ConveyorError:
        return invalid_arg(f"failed to parse the {method} request message: {self.why}")


def lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``parse``, answering ``Malformed`` instead of raising on undecodable bytes."""

    def deserialize(buf: bytes) -> Any:
        try:
            return parse(buf)
        except DecodeError as err:
            return Malformed(str(err) or "not a valid protobuf message")

    return deserialize


class _HandlerRecorder:
    """Stands in for a server to capture a generated ``add_*_to_server``'s method table."""

    handlers: dict[str, Any] | None = None

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.handlers = dict(handlers)


def method_handlers(add_to_server: Callable[[Any, Any], None], servicer: Any) -> dict[str, Any]:
    """The generated method table of ``servicer``, every deserializer made ``lenient``."""
    recorder = _HandlerRecorder()
    add_to_server(servicer, recorder)
    if recorder.handlers is None:
        raise RuntimeError("the generated module did not register method handlers (regenerate proto/)")
    return {
        name: handler._replace(request_deserializer=lenient(handler.request_deserializer))
        if handler.request_deserializer is not None else handler
        for name, handler in recorder.handlers.items()
    }
