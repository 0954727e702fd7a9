"""``--grpc-restricted-protocol`` as a server interceptor, installed only when some
protocol is restricted. Which RPC belongs to which category is fixed, so the
per-call cost is one dict lookup by method path, and a metadata scan for
restricted methods only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from conveyor.ingress.restricted import Restriction, grpc_refusal

_INFERENCE = "/inference.GRPCInferenceService/"
_HEALTH = "/grpc.health.v1.Health/"

# Triton's grouping (server src/grpc): the standard health service counts as "health".
METHOD_CATEGORIES: dict[str, str] = {
    **{_INFERENCE + m: "health" for m in ("ServerLive", "ServerReady", "ModelReady")},
    **{_HEALTH + m: "health" for m in ("Check", "Watch")},
    **{_INFERENCE + m: "metadata" for m in ("ServerMetadata", "ModelMetadata")},
    **{_INFERENCE + m: "inference" for m in ("ModelInfer", "ModelStreamInfer")},
    _INFERENCE + "ModelConfig": "model-config",
    _INFERENCE + "ModelStatistics": "statistics",
    **{_INFERENCE + m: "model-repository" for m in ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload")},
    **{_INFERENCE + kind + m: "shared-memory"
       for kind in ("SystemSharedMemory", "CudaSharedMemory") for m in ("Status", "Register", "Unregister")},
    _INFERENCE + "TraceSetting": "trace",
    _INFERENCE + "LogSettings": "logging",
}
_STREAMING_REQUESTS = {_INFERENCE + "ModelStreamInfer"}
_STREAMING_RESPONSES = {_HEALTH + "Watch"}


def method_restrictions(rules: dict[str, Restriction]) -> dict[str, tuple[str, str, str]]:
    """Method path -> (header, value, refusal message), for the restricted methods."""
    return {
        method: (rule.header, rule.value, grpc_refusal(rule))
        for method, category in METHOD_CATEGORIES.items()
        if (rule := rules.get(category)) is not None
    }


def _refusal_handler(method: str, message: str) -> Any:
    """A handler of ``method``'s kind that only refuses (UNAVAILABLE, Triton's code)."""

    async def refuse(request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    if method in _STREAMING_REQUESTS:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if method in _STREAMING_RESPONSES:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


class RestrictedProtocols(grpc.aio.ServerInterceptor):
    def __init__(self, rules: dict[str, Restriction]) -> None:
        # method path -> (header, value, the handler that refuses it)
        self._by_method = {
            method: (rule.header, rule.value, _refusal_handler(method, grpc_refusal(rule)))
            for method, category in METHOD_CATEGORIES.items()
            if (rule := rules.get(category)) is not None
        }

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: grpc.HandlerCallDetails
    ) -> Any:
        entry = self._by_method.get(details.method)
        if entry is not None:
            header, value, refusal = entry
            if not any(k == header and v == value for k, v in details.invocation_metadata or ()):
                return refusal
        return await continuation(details)
