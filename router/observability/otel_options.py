"""The OpenTelemetry trace mode's settings: where spans go and how they are batched.

Triton's names and defaults: ``--trace-config opentelemetry,url=...`` (OTLP/HTTP,
protobuf), ``opentelemetry,resource=KEY=VALUE`` (repeatable), and the batch span
processor's ``bsp_max_queue_size``, ``bsp_schedule_delay`` (ms) and
``bsp_max_export_batch_size``. The standard environment variables
(``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*``) apply where the flag does not say.
They are set at start only, as in Triton.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

DEFAULT_URL = "http://localhost:4318/v1/traces"
DEFAULT_RESOURCE = (("service.name", "triton-inference-server"),)  # Triton's, so existing queries still match

_BSP = {  # --trace-config name -> (field, environment variable)
    "bsp_max_queue_size": ("max_queue_size", "OTEL_BSP_MAX_QUEUE_SIZE"),
    "bsp_schedule_delay": ("schedule_delay_ms", "OTEL_BSP_SCHEDULE_DELAY"),
    "bsp_max_export_batch_size": ("max_export_batch_size", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
}


@dataclass(frozen=True)
class OtelOptions:
    url: str = DEFAULT_URL
    resource: tuple[tuple[str, str], ...] = DEFAULT_RESOURCE
    max_queue_size: int = 2048  # spans waiting for export; more are dropped (and counted)
    schedule_delay_ms: int = 5000  # the longest a span waits before its batch is sent
    max_export_batch_size: int = 512  # spans per request to the collector

    def wire(self) -> dict[str, Any]:
        """As the trace extension shows them (strings; ``resource`` as a list of ``KEY=VALUE``)."""
        return {
            "url": self.url, "resource": [f"{k}={v}" for k, v in self.resource],
            "bsp_max_queue_size": str(self.max_queue_size), "bsp_schedule_delay": str(self.schedule_delay_ms),
            "bsp_max_export_batch_size": str(self.max_export_batch_size),
        }


def full_url(url: str) -> str:
    """Triton takes ``host:port/path``; ``http://`` is implied when no scheme is given."""
    return url if "://" in url else f"http://{url}"


def _positive(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got '{value}'") from None
    if number <= 0:
        raise ValueError(f"{name} must be positive, got {number}")
    return number


def _resource_pairs(text: str, where: str) -> list[tuple[str, str]]:
    """``OTEL_RESOURCE_ATTRIBUTES``: comma-separated ``KEY=VALUE`` pairs."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{where}: a resource attribute is KEY=VALUE, got '{item}'")
        pairs.append((key.strip(), value.strip()))
    return pairs


def parse_otel_setting(settings: list[tuple[str, str]], env: dict[str, str] | None = None) -> OtelOptions:
    """The ``opentelemetry,KEY=VALUE`` items of ``--trace-config`` (flag over environment over default)."""
    env = dict(os.environ) if env is None else env
    resource = dict(DEFAULT_RESOURCE)
    resource.update(_resource_pairs(env.get("OTEL_RESOURCE_ATTRIBUTES", ""), "OTEL_RESOURCE_ATTRIBUTES"))
    fields: dict[str, Any] = {}
    for field_name, variable in _BSP.values():
        if env.get(variable):
            fields[field_name] = _positive(variable, env[variable])
    url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or DEFAULT_URL
    if not env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        url = env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"  # the base URL, as the spec says
    for key, value in settings:
        if key == "url":
            if not value:
                raise ValueError("opentelemetry,url needs a value")
            url = value
        elif key == "resource":  # one attribute per flag; its value is everything after the first '='
            name, sep, text = value.partition("=")
            if not sep or not name:
                raise ValueError(f"opentelemetry,resource is KEY=VALUE, got '{value}'")
            resource[name] = text
        elif key in _BSP:
            fields[_BSP[key][0]] = _positive(key, value)
        else:
            raise ValueError(f"unsupported --trace-config 'opentelemetry,{key}={value}' "
                             f"(settings: url, resource, {', '.join(_BSP)})")
    options = OtelOptions(full_url(url), tuple(resource.items()), **fields)
    if options.max_export_batch_size > options.max_queue_size:
        raise ValueError(f"bsp_max_export_batch_size ({options.max_export_batch_size}) must not exceed "
                         f"bsp_max_queue_size ({options.max_queue_size})")
    return options
