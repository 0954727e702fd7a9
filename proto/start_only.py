"""The log and trace file locations: set at start (``--log-file``, ``--trace-config triton,file=``), never
through the protocol.

A file path chosen by a client is a write of the server's bytes to any file the server may open
(Triton's CVE-2024-0087, closed in its PRs 7090/7092/7102). Triton refuses such a request with
UNSUPPORTED (HTTP 501, gRPC UNIMPLEMENTED) before it applies any other setting of the request; so
does Conveyor, in the router (every ingress's requests reach the settings there) and in an ingress
where the protocol says more than the router sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conveyor.proto.errors import unsupported

LOG_FILE = "log_file"
TRACE_FILE = "trace_file"
LOG_FILE_REFUSAL = "log file location can not be updated through network protocol"
TRACE_FILE_REFUSAL = "trace file location can not be updated through network protocol"


def refuse_log_file(settings: Mapping[str, Any]) -> None:
    """A ``log_file`` member is refused unless it is null (Triton's HTTP rule: null means "leave it"), whatever
    its value: the current one and "" too."""
    if settings.get(LOG_FILE) is not None:
        raise unsupported(LOG_FILE_REFUSAL)


def refuse_trace_file(settings: Mapping[str, Any]) -> None:
    """A ``trace_file`` member is refused whatever its value, null (gRPC: no value) included, as in Triton."""
    if TRACE_FILE in settings:
        raise unsupported(TRACE_FILE_REFUSAL)
