"""A model version's tensor signature, as the router describes it (control op
``signature``): what a request is checked against before it is sent.

Used by the ingress (``ingress/model_cache.py``) and by workers for BLS requests
(``workers/bls_signatures.py``), so both refuse a bad request the same way.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.proto.messages import OutputSpec

# Each input's byte size (the request's order), the output specs, whether a client region is named.
Verdict = tuple[list[int], list["OutputSpec"], bool]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension; -1 = any
    optional: bool = False

    def accepts(self, dims: list[int]) -> bool:
        if len(dims) != len(self.dims):
            return False
        return all(want == -1 or want == got for want, got in zip(self.dims, dims, strict=True))


@dataclass(frozen=True, slots=True)
class ModelSignature:
    name: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    decoupled: bool = False  # answers with a stream of responses (gRPC ModelStreamInfer only)
    response_cache: bool = False  # requests carry ``cache_key`` (the router caches responses)
    # Decoupled, yet one response to a request that does not stream (vLLM): plain infer serves it.
    plain_infer: bool = False
    # Placed by its prompt's prefix across several engines: requests carry ``prefix`` (ingress/prefix_key.py).
    prefix_placed: bool = False
    # MAX_MIGRATIONS of a vLLM model: how often a request moves when its worker dies (ingress/migration.py); 0: never.
    max_migrations: int = 0
    required_inputs: int = field(init=False)  # the inputs that are not optional
    # The checks' verdicts on calls by their ``shape_key`` (``request_checks.remember_verdict``): kept on
    # the signature, so that a model reloaded with another signature starts without any.
    verdicts: dict[Hashable, Verdict] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "required_inputs", sum(not spec.optional for spec in self.inputs.values()))

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ModelSignature:
        def specs(items: list[dict[str, Any]]) -> dict[str, TensorSpec]:
            return {
                t["name"]: TensorSpec(t["name"], t["datatype"], tuple(t["dims"]), bool(t.get("optional")))
                for t in items
            }

        return cls(
            d["name"], int(d["max_batch_size"]), specs(d["inputs"]), specs(d["outputs"]), bool(d.get("decoupled")),
            bool(d.get("response_cache")), bool(d.get("plain_infer")), bool(d.get("prefix_placed")),
            int(d.get("max_migrations") or 0),
        )
