"""The gRPC ingress: Triton's ``inference.GRPCInferenceService`` on grpc.aio.

Modules: ``wire`` (zero-copy framing of the infer messages), ``codec``
(messages <-> data plane), ``stream`` (ModelStreamInfer pipelining),
``service`` and ``health`` (the servicers), ``server`` (the process).
"""

from conveyor.ingress.grpc.server import serve

__all__ = ["serve"]
