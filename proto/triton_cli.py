"""Which command started the group, where ``tritonserver`` and ``conveyor serve`` differ: read by the
supervisor and the router alike (so it lives here, light: no actor's modules)."""

from __future__ import annotations

import os
import signal

# Set by the ``tritonserver`` command for its group (its children inherit it): there, as in Triton, a
# repository root the server cannot use with --exit-on-error=false leaves it running, neither live nor
# ready (SERVER_FAILED_TO_INITIALIZE). ``conveyor serve`` stops its start whatever --exit-on-error says.
# And an unload waits for a load of its model in progress (``unload_waits_for_load``).
TRITON_CLI_ENV = "CONVEYOR_TRITON_CLI"


def unload_waits_for_load() -> bool:
    """Whether an unload that arrives while its model loads waits for that load to settle (Triton's order: both
    calls succeed, then the model is unloaded). ``conveyor serve`` cancels the load instead (CANCELLED)."""
    return os.environ.get(TRITON_CLI_ENV) == "1"


def keeps_running_when_unusable(exit_on_error: bool) -> bool:
    """Whether a root the server cannot use leaves it running (Triton's --exit-on-error=false)."""
    return not exit_on_error and os.environ.get(TRITON_CLI_ENV) == "1"


def picks_the_only_model() -> bool:
    """Whether SageMaker's ``/invocations`` without SAGEMAKER_TRITON_DEFAULT_MODEL_NAME serves the repository's
    only model (``conveyor serve``: what Triton's ``serve`` script does before it starts the server). Triton's
    server itself, the ``tritonserver`` command's, names the model 'unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME'."""
    return os.environ.get(TRITON_CLI_ENV) != "1"


# Set by the supervisor in the environment of a child it restarts: the checks Triton makes once, as its server
# starts, are not made again by a restarted actor (a group that had started is not refused afterwards).
RESTART_ENV = "CONVEYOR_RESTART"


def checks_endpoints_at_start() -> bool:
    """Whether an endpoint makes Triton's start-up checks (the Vertex AI default model): under ``tritonserver``,
    on an actor's first start. ``conveyor serve`` answers each request instead (a 400 with Triton's message)."""
    return os.environ.get(TRITON_CLI_ENV) == "1" and RESTART_ENV not in os.environ


def stops_listening_at_once(drain_grace_s: float) -> bool:
    """Whether a gRPC ingress that is told to stop closes its listener and sends GOAWAY at once, its running calls
    finishing within the exit timeout (Triton's GracefulStop: a new call is "Connection refused"). ``conveyor
    serve``, and a drain grace, keep the port open and answer new calls UNAVAILABLE while the calls drain."""
    return drain_grace_s <= 0 and os.environ.get(TRITON_CLI_ENV) == "1"


# Sent by the supervisor to its router as the workers' stop begins (Triton's core stop, after its endpoints'): a
# leaving worker's instances are not moved to the others (they leave too), and under ``tritonserver`` the router
# logs Triton's lines of the in-flight inferences per model version once.
CORE_STOP_SIGNAL = signal.SIGUSR2


def is_triton_cli() -> bool:
    """Whether the ``tritonserver`` command started this group."""
    return os.environ.get(TRITON_CLI_ENV) == "1"

# In the group's run folder: the stop's deadline (time.monotonic(), one clock for the whole host), written by the
# supervisor before CORE_STOP_SIGNAL, so the router's lines count down what is left of the exit timeout, as Triton's.
STOP_DEADLINE_FILE = "stop-deadline"
