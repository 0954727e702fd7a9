"""The ORCA load report a gateway asks for (``endpoint-load-metrics-format: TEXT`` or ``JSON`` on a
completion or chat request): the ``endpoint-load-metrics`` response header, as vLLM's server writes it,
so that a load balancer that weighs endpoints by it (Envoy's ORCA support, the Gateway API Inference
Extension's pickers) can weigh this one.

The figures are the model's, from the router (control op ``model_load``): its engines' KV-cache use
(while it runs requests), and its waiting and running requests as the overload limits count them
(docs/LLM.md). Only a request that asks pays the round trip to the router.
"""

from __future__ import annotations

import orjson

FORMAT_HEADER = "endpoint-load-metrics-format"
HEADER = "endpoint-load-metrics"
FORMATS = ("TEXT", "JSON")


def asked_format(value: str | None) -> str:
    """The format a request's header asks for, as written here ("" for none or one not served)."""
    wanted = (value or "").strip().upper()
    return wanted if wanted in FORMATS else ""


def render(fmt: str, named: dict[str, float]) -> str:
    """The header's value: ``TEXT named_metrics.<name>=<value>, ...`` or ``JSON {"named_metrics": {...}}``."""
    if fmt == "JSON":
        return "JSON " + orjson.dumps({"named_metrics": named}).decode()
    return "TEXT " + ", ".join(f"named_metrics.{name}={value}" for name, value in named.items())
