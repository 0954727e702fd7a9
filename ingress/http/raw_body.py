"""Triton's raw binary request: ``Inference-Header-Content-Length: 0`` means the
whole body is the bytes of the model's only input, batch 1, every output binary."""

from __future__ import annotations

from conveyor.ingress.dataplane import InferCall
from conveyor.ingress.http.codec import HttpInferRequest
from conveyor.ingress.request_checks import InferInput
from conveyor.ingress.signature import ModelSignature
from conveyor.proto.datatypes import element_count, element_size
from conveyor.proto.errors import invalid_arg


def raw_infer_request(body: memoryview, model: str, version: str, sig: ModelSignature) -> HttpInferRequest:
    if len(sig.inputs) != 1:
        raise invalid_arg(
            f"a raw binary request (Inference-Header-Content-Length: 0) needs a model with exactly one input; "
            f"'{model}' has {len(sig.inputs)}"
        )
    spec = next(iter(sig.inputs.values()))
    dims = list(spec.dims)
    wildcards = [i for i, d in enumerate(dims) if d < 0]
    if spec.datatype == "BYTES" or len(wildcards) > 1:
        if wildcards:
            raise invalid_arg(
                f"input '{spec.name}' of '{model}' has a variable shape {dims}: a raw binary request cannot "
                "say its shape; send a JSON header instead"
            )
    elif wildcards:
        # One variable dimension: the body's length decides it.
        fixed = element_count(d for d in dims if d >= 0) * element_size(spec.datatype)
        if fixed == 0 or len(body) % fixed:
            raise invalid_arg(f"raw body of {len(body)} bytes does not fit input '{spec.name}' of shape {dims}")
        dims[wildcards[0]] = len(body) // fixed
    shape = ([1] if sig.max_batch_size > 0 else []) + dims
    call = InferCall(model, version, [InferInput(spec.name, spec.datatype, shape, body)])
    return HttpInferRequest(call, binary_default=True)
