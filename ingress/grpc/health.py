"""The standard gRPC health service (``grpc.health.v1.Health``).

Load balancers and Kubernetes' gRPC probes call it instead of Triton's own
ServerReady; both answer from the router's view of readiness.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.grpc.handlers import Malformed, method_handlers
from conveyor.proto import health_pb2, health_pb2_grpc
from conveyor.proto.control import RouterClient
from conveyor.proto.errors import ConveyorError, Status

# "" is the whole server (the health-checking spec); the other is Triton's service.
SERVICES = frozenset({"", "inference.GRPCInferenceService"})

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

WATCH_INTERVAL_S = 1.0


async def server_ready(link: RouterClient, drain: IngressDrain | None = None) -> bool:
    """Whether the router says the server is ready; an unreachable router, or this
    process draining, means no."""
    if drain is not None and drain.draining:
        return False
    try:
        return await link.server_ready()
    except ConveyorError as err:
        if err.status is Status.UNAVAILABLE:
            return False
        raise


class HealthServicer:
    def __init__(self, link: RouterClient, drain: IngressDrain | None = None) -> None:
        self._link = link
        self._drain = drain

    async def _status(self) -> Any:
        return _SERVING if await server_ready(self._link, self._drain) else _NOT_SERVING

    async def Check(self, request: Any, context: Any) -> Any:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error("Check").message)
        if request.service not in SERVICES:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service}'")
        return health_pb2.HealthCheckResponse(status=await self._status())

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """Send the status now and again whenever it changes (polled: the router
        does not push readiness)."""
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error("Watch").message)
        if request.service not in SERVICES:
            # The spec: answer SERVICE_UNKNOWN and keep the call open, not fail it.
            yield health_pb2.HealthCheckResponse(status=_SERVICE_UNKNOWN)
            await asyncio.get_running_loop().create_future()  # until the client leaves
        last = None
        while True:
            status = await self._status()
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await asyncio.sleep(WATCH_INTERVAL_S)


SERVICE = "grpc.health.v1.Health"


def handler_table(servicer: HealthServicer) -> dict[str, Any]:
    return method_handlers(health_pb2_grpc.add_HealthServicer_to_server, servicer)


def add_to_server(servicer: HealthServicer, server: Any) -> None:
    # Generic only, as the inference service (service.add_to_server says why).
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handler_table(servicer)),))
