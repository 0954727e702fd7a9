"""``inference.GRPCInferenceService``: a thin adapter over the data plane.

Every RPC converts its request with ``codec``, asks the data plane or the
router, and converts back. A ``ConveyorError`` becomes the gRPC status of its
Triton code (``proto/errors.py``); anything else is logged and reported as
INTERNAL. ModelStreamInfer is the exception: its errors travel in-band and
the stream stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import grpc

from conveyor.ingress import tensor_migration
from conveyor.ingress.dataplane import DataPlane, InferCall, StreamError
from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.grpc import codec, wire
from conveyor.ingress.grpc.handlers import Malformed, lenient, method_handlers
from conveyor.ingress.grpc.health import server_ready
from conveyor.ingress.grpc.request_templates import RequestTemplates
from conveyor.ingress.grpc.stream import Replies, stream_replies
from conveyor.ingress.router_link import RouterLink
from conveyor.ingress.server_metadata import server_metadata
from conveyor.proto import grpc_service_pb2 as pb
from conveyor.proto import grpc_service_pb2_grpc as pb_grpc
from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status, grpc_code_name, invalid_arg, unsupported
from conveyor.proto.start_only import LOG_FILE, LOG_FILE_REFUSAL

if TYPE_CHECKING:
    from conveyor.ingress.grpc.h2_server.calls import Direct
    from conveyor.ingress.grpc.h2_server.outbound import Outbound
    from conveyor.ingress.grpc.h2_server.stream import Running, Stream

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"


def _grpc_code(status: Status) -> grpc.StatusCode:
    return grpc.StatusCode[grpc_code_name(status)]  # read when rendered: --client-mistakes-as-400 changes it


# How ModelInfer names itself when it refuses a decoupled model (Triton's words).
_UNARY = "ModelInfer RPC"
# The request parameter asking for a response that carries only the final flag.
_EMPTY_FINAL = "triton_enable_empty_final_response"

_S = TypeVar("_S")
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


async def _abort(context: Any, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("context.abort returned")  # it raises AbortError


def _internal_message(err: BaseException) -> str:
    return f"internal error: {type(err).__name__}: {err}"


def _unary(
    method: Callable[[_S, _Req, Any], Awaitable[_Resp]],
) -> Callable[[_S, _Req, Any], Coroutine[Any, Any, _Resp]]:
    """Render the errors of a unary RPC as gRPC statuses."""

    @functools.wraps(method)
    async def handler(self: _S, request: _Req, context: Any) -> _Resp:
        try:
            if isinstance(request, Malformed):
                raise request.error(method.__name__)
            return await method(self, request, context)
        except ConveyorError as err:
            await _abort(context, _grpc_code(err.status), err.message)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as err:
            log.exception("%s failed", method.__name__)
            await _abort(context, grpc.StatusCode.INTERNAL, _internal_message(err))

    return handler


def _time_left(context: Any) -> float | None:
    """The client's deadline as a timeout, None without one."""
    remaining = context.time_remaining()
    # 0 means "already due", not "no deadline": keep it positive for the data plane.
    return None if remaining is None else max(remaining, 1e-6)


def _traceparent(context: Any) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent":
            return str(value)
    return ""


class _EndStream(bytes):
    """Not a reply: ``triton_grpc_error`` asked that the stream end with this error's status.
    It travels the replies' queue as one (empty bytes), so the stream's pipelining is unchanged."""

    error: ConveyorError

    def __new__(cls, error: ConveyorError) -> _EndStream:
        marker = super().__new__(cls)
        marker.error = error
        return marker


def _wants_grpc_error(context: Any) -> bool:
    """The ``triton_grpc_error: true`` header: errors end the stream with their gRPC status
    (Triton's stream option) instead of travelling in-band."""
    for key, value in context.invocation_metadata() or ():
        if key == "triton_grpc_error":
            return str(value).lower() == "true"
    return False


def _fail(out: Outbound, stream: Stream, err: Exception) -> None:
    """``err`` as ModelInfer's status, as ``_unary`` renders it."""
    if isinstance(err, ConveyorError):
        out.finish(stream, _grpc_code(err.status).value[0], err.message)
        return
    log.exception("ModelInfer failed")
    out.finish(stream, grpc.StatusCode.INTERNAL.value[0], _internal_message(err))


class _Answer:
    """A ModelInfer request sent without a task (``InferenceServicer.start_infer``), until its answer.
    It stands as the stream's task (``Running``): a reset stream, a lost connection or a stopping server
    cancels it, which abandons the request as cancelling the task did (the router is told; the answer,
    when it comes, only frees its memory). The client's deadline finishes it the same way (``_expire``)."""

    __slots__ = ("_call", "_dataplane", "_done", "_out", "_rid", "_stream")

    def __init__(self, dataplane: DataPlane, call: InferCall, rid: int, out: Outbound, stream: Stream) -> None:
        self._dataplane = dataplane
        self._call = call
        self._rid = rid
        self._out = out
        self._stream = stream
        self._done = False

    def answered(self, response: m.InferResponse) -> None:
        self._done = True
        try:
            body = codec.encode_infer_response(self._dataplane.answered(response, self._call))
        except Exception as err:
            _fail(self._out, self._stream, err)
            return
        self._out.reply(self._stream, body)

    def done(self) -> bool:
        return self._done

    def cancel(self, msg: Any | None = None) -> bool:
        if self._done:
            return False
        self._done = True
        dataplane = self._dataplane
        dataplane.abandoned()
        dataplane.link.abandon(self._rid)
        return True


class _Answered:
    """A direct call answered at once (an error): nothing runs."""

    __slots__ = ()

    def done(self) -> bool:
        return True

    def cancel(self, msg: Any | None = None) -> bool:
        return False


_ANSWERED = _Answered()


class InferenceServicer:
    """The RPCs of ``inference.GRPCInferenceService`` (names are Triton's)."""

    def __init__(self, link: RouterLink, dataplane: DataPlane, drain: IngressDrain | None = None) -> None:
        self._link = link
        self._dataplane = dataplane
        self._drain = drain
        self._server_metadata = codec.server_metadata_response(server_metadata())
        self._forward = dataplane.limits.header_forward  # --grpc-header-forward-pattern, None: off
        self._templates = RequestTemplates()

    # --- health and metadata ---------------------------------------------------------

    @_unary
    async def ServerLive(self, request: Any, context: Any) -> Any:
        # This process answering is the liveness; it must not depend on models loading. A server that
        # failed to initialize is not live (the router's SettingsUpdate).
        return pb.ServerLiveResponse(live=self._link.live)

    @_unary
    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=await server_ready(self._link, self._drain))

    @_unary
    async def ModelReady(self, request: Any, context: Any) -> Any:
        return pb.ModelReadyResponse(ready=await self._link.model_ready(request.name, request.version))

    @_unary
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return self._server_metadata

    @_unary
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        meta = await self._link.model_metadata(request.name, request.version)
        return codec.model_metadata_response(meta)

    @_unary
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        config = await self._link.model_config(request.name, request.version)
        return codec.model_config_response(config)

    @_unary
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        # "" asks for every model / every version.
        stats = await self._link.model_stats(request.name, request.version)
        return codec.model_statistics_response(stats)

    # --- inference -------------------------------------------------------------------

    @_unary
    async def ModelInfer(self, request: wire.WireInferRequest, context: Any) -> bytes:
        call = request.call or self._infer_call(request, context)  # made already when start_infer left it
        return codec.encode_infer_response(await self._dataplane.infer(call, endpoint=_UNARY))

    def _infer_call(self, request: wire.WireInferRequest, context: Any) -> InferCall:
        try:
            call = self._templates.call(request.message, request.raw, timeout_s=_time_left(context))
        except ConveyorError as exc:  # counted as the model's REJECTED failure
            self._dataplane.refused(request.message.model_name, request.message.model_version, exc)
            raise
        if self._link.tracing:
            call.traceparent = _traceparent(context)
        if self._forward is not None:
            self._forward.apply(context.invocation_metadata() or (), call.parameters)
        return call

    def start_infer(self, request: wire.WireInferRequest | Malformed, stream: Stream, out: Outbound) -> Running | None:
        """ModelInfer without a task (``h2_server``'s ``calls.Direct``), as the HTTP ingress serves a plain
        request (``http/fast_protocol.py``): when nothing but the router's answer waits (``DataPlane.start``:
        a templated call to a model whose signature is cached and that is not decoupled), the request is
        sent now and the answer's callback replies (``_Answer``). None: the call runs ``ModelInfer`` in a
        task, with the call made here (``request.call``). The same statuses and messages as ``_unary``."""
        if type(request) is not wire.WireInferRequest:
            return None  # Malformed: ``_unary`` words it
        try:
            call = request.call = self._infer_call(request, stream.ctx)
            sent = self._dataplane.start(call)
        except Exception as err:
            _fail(out, stream, err)
            return _ANSWERED
        if sent is None:
            return None
        answer = _Answer(self._dataplane, call, sent.id, out, stream)
        self._link.submit(sent, answer.answered)
        return answer

    async def ModelStreamInfer(
        self, requests: AsyncIterable[wire.WireInferRequest | Malformed], context: Any
    ) -> AsyncIterator[bytes]:
        handle = functools.partial(self._stream_request, context, _wants_grpc_error(context))
        # aclosing: when grpc stops iterating (client gone), the running requests
        # are cancelled now rather than when the generator is collected.
        async with contextlib.aclosing(stream_replies(requests, handle)) as replies:
            async for message in replies:
                if isinstance(message, _EndStream):  # triton_grpc_error: the first error ends the stream
                    await _abort(context, _grpc_code(Status(message.error.status)), message.error.message)
                yield message

    async def _stream_request(
        self, context: Any, grpc_error: bool, request: wire.WireInferRequest | Malformed, replies: Replies
    ) -> None:
        """One request of a stream; its errors in-band, or with ``grpc_error`` (the client's
        ``triton_grpc_error: true`` header) as the stream's own gRPC status, which ends it."""
        if isinstance(request, Malformed):
            # In-band like every stream error (unless triton_grpc_error): the stream and its other requests go on.
            error = request.error("ModelStreamInfer")
            reply = _EndStream(error) if grpc_error else codec.encode_stream_error(error.message, "")
            await replies.send_in_order(reply)
            return
        try:
            call = self._templates.call(request.message, request.raw, timeout_s=_time_left(context))
            if self._forward is not None:
                self._forward.apply(context.invocation_metadata() or (), call.parameters)
            if await self._dataplane.is_decoupled(call.model, call.version):
                await self._stream_decoupled(call, replies, grpc_error)
                return
            # Every stream response carries triton_final_response, as Triton's stream handler sets it.
            reply = codec.encode_infer_response(
                await self._dataplane.infer(call, endpoint=_UNARY, turn=replies.send_turn), stream=True, final=True
            )
        except ConveyorError as err:
            reply = _EndStream(err) if grpc_error else codec.encode_stream_error(err.message, request.message.id)
        except Exception as err:  # not CancelledError: that ends the stream
            log.exception("ModelStreamInfer request failed")
            message = _internal_message(err)
            reply = (_EndStream(ConveyorError(Status.INTERNAL, message)) if grpc_error
                     else codec.encode_stream_error(message, request.message.id))
        await replies.send_in_order(reply)

    async def _stream_decoupled(self, call: InferCall, replies: Replies, grpc_error: bool = False) -> None:
        """Each response as the model sends it, with ``triton_final_response`` (as Triton sets
        it on every stream response). A bare final flag (no outputs) is sent only to a client
        that asked for it, as in Triton."""
        flag = bool(call.parameters.get(_EMPTY_FINAL))
        # A vLLM model's request moves to another engine if its worker dies (ingress/tensor_migration.py).
        resume = tensor_migration.plan(call, await self._dataplane.models.get(call.model, call.version))
        stream = (self._dataplane.infer_stream(call, replies.send_turn) if resume is None
                  else tensor_migration.resumed_stream(self._dataplane, call, resume, replies.send_turn))
        async with contextlib.aclosing(stream) as responses:
            async for part in responses:
                if isinstance(part, StreamError) and grpc_error:
                    await replies.send(_EndStream(part.error))
                    return
                if isinstance(part, StreamError):
                    reply = codec.encode_stream_error(part.error.message, call.id, part.final)
                elif part.final and not part.outputs and not flag:
                    part.release()
                    continue
                else:
                    reply = codec.encode_infer_response(part, stream=True, final=part.final)
                await replies.send(reply)

    # --- shared memory: the router keeps the registry ------------------------------------

    @_unary
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        rows = await self._link.shm_status("system", request.name)
        response = pb.SystemSharedMemoryStatusResponse()
        for row in rows:
            response.regions[row["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**row)
            )
        return response

    @_unary
    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await self._link.shm_register("system", request.name, request.byte_size, key=request.key, offset=request.offset)
        return pb.SystemSharedMemoryRegisterResponse()

    @_unary
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self._link.shm_unregister("system", request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_unary
    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        rows = await self._link.shm_status("cuda", request.name)
        response = pb.CudaSharedMemoryStatusResponse()
        for row in rows:
            response.regions[row["name"]].CopyFrom(pb.CudaSharedMemoryStatusResponse.RegionStatus(**row))
        return response

    @_unary
    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await self._link.shm_register("cuda", request.name, request.byte_size, handle=request.raw_handle,
                                      device_id=request.device_id)
        return pb.CudaSharedMemoryRegisterResponse()

    @_unary
    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self._link.shm_unregister("cuda", request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    @_unary
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        rows = await self._link.repository_index(request.ready)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**r) for r in rows])

    @_unary
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        config, files = "", {}
        for key, param in request.parameters.items():
            kind = param.WhichOneof("parameter_choice")
            if key == "config" and kind == "string_param":
                config = param.string_param
            elif key.startswith("file:") and kind == "bytes_param":
                files[key[5:]] = param.bytes_param
            else:
                raise invalid_arg(f"unexpected parameter '{key}' in the load request")
        await self._link.repository_load(request.model_name, config, files)
        return pb.RepositoryModelLoadResponse()

    @_unary
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        param = request.parameters.get("unload_dependents")
        dependents = bool(param.bool_param) if param is not None else False
        await self._link.repository_unload(request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    # --- trace and logging extensions: the router keeps the settings -------------------------

    @_unary
    async def TraceSetting(self, request: Any, context: Any) -> Any:
        # An entry without values clears that setting (null in the HTTP form).
        settings = {k: (list(v.value) or None) for k, v in request.settings.items()}
        doc = await self._link.trace_settings(request.model_name, settings)
        response = pb.TraceSettingResponse()
        for key, value in doc.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    @_unary
    async def LogSettings(self, request: Any, context: Any) -> Any:
        if LOG_FILE in request.settings:
            # As Triton, an entry without a value too (the router sees only the entries with one).
            raise unsupported(LOG_FILE_REFUSAL)
        settings = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in request.settings.items()
                    if v.WhichOneof("parameter_choice")}
        doc = await self._link.log_settings(settings)
        response = pb.LogSettingsResponse()
        for key, value in doc.items():
            slot = response.settings[key]
            if isinstance(value, bool):
                slot.bool_param = value
            elif isinstance(value, int):
                slot.uint32_param = value
            else:
                slot.string_param = value
        return response


def handler_table(servicer: InferenceServicer) -> dict[str, Any]:
    """The RPCs of ``servicer`` by method name, as ``grpc.RpcMethodHandler`` values.

    The table is the generated one, except that the two infer RPCs use
    ``wire``'s zero-copy framing: they take a ``WireInferRequest`` and return
    serialized bytes; and that a message protobuf cannot parse reaches the
    handler as ``Malformed`` (INVALID_ARGUMENT), see ``handlers``.
    """
    handlers = method_handlers(pb_grpc.add_GRPCInferenceServiceServicer_to_server, servicer)
    for name in ("ModelInfer", "ModelStreamInfer"):
        handlers[name] = handlers[name]._replace(
            request_deserializer=lenient(wire.parse_infer_request), response_serializer=None
        )
    return handlers


def direct_table(servicer: InferenceServicer) -> dict[str, Direct]:
    """The methods ``h2_server`` may answer without a task, by path (``calls.Direct``)."""
    return {f"/{SERVICE}/ModelInfer": servicer.start_infer}


def add_to_server(servicer: InferenceServicer, server: Any) -> None:
    """Register ``servicer`` on a ``grpc.aio`` server, as a generic handler."""
    # Generic only, not also add_registered_method_handlers: grpc.aio keeps one
    # pending call request per registered method and waits on all of them
    # (asyncio.wait) for every call it accepts, which costs more than the
    # dictionary look-up of the generic table.
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handler_table(servicer)),))
