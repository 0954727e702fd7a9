"""Triton's raw binary request: ``Inference-Header-Content-Length: 0`` means the
whole body is the bytes of the model's only input, batch 1, every output binary.

The shape is deduced as Triton's ``InferenceRequest::Normalize`` does: the
config's dims (after a batch dimension of 1 when the model batches), the one
variable dimension, if any, from the body's size. A BYTES input must have shape
``[1]``: the body is that one element, and gets its 4-byte length prefix here.
The errors are Triton's, word for word.
"""

from __future__ import annotations

from conveyor.ingress.dataplane import InferCall
from conveyor.ingress.http.codec import HttpInferRequest
from conveyor.proto.datatypes import element_size
from conveyor.proto.errors import invalid_arg, request_prefix
from conveyor.proto.request_checks import InferInput
from conveyor.proto.signature import ModelSignature

# A raw body has no JSON header, so no request id.
_NO_ID = request_prefix("")


def raw_infer_request(body: memoryview, model: str, version: str, sig: ModelSignature) -> HttpInferRequest:
    if len(sig.inputs) != 1:
        raise invalid_arg(
            f"{_NO_ID}Raw request must only have 1 input (found 1) to be deduced but got {len(sig.inputs)} inputs in "
            f"'{model}' model configuration"
        )
    spec = next(iter(sig.inputs.values()))
    shape = [1] if sig.max_batch_size > 0 else []
    dynamic_axis = -1
    fixed = 1
    for dim in spec.dims:
        if dim < 0:
            if dynamic_axis != -1:
                raise invalid_arg(
                    f"{_NO_ID}The shape of the raw input '{spec.name}' can not be deduced because there are more "
                    "than one variable-sized dimension"
                )
            dynamic_axis = len(shape)
        else:
            fixed *= dim
        shape.append(dim)
    data: memoryview | bytes = body
    if spec.datatype == "BYTES":
        if dynamic_axis != -1 or fixed != 1:
            raise invalid_arg(f"{_NO_ID}For BYTE datatype raw input '{spec.name}', the model must have input shape [1]")
        data = len(body).to_bytes(4, "little") + body  # the one element, in the wire form
    elif dynamic_axis != -1:
        size = fixed * element_size(spec.datatype)
        # Triton divides and lets the byte-size check catch a remainder; so does this.
        shape[dynamic_axis] = len(body) // size if size else 0
    call = InferCall(model, version, [InferInput(spec.name, spec.datatype, shape, data)])
    return HttpInferRequest(call, binary_default=True)
