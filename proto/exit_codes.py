"""The exit codes of a group's processes, in one table so that no two reasons share a code: the supervisor
acts on an actor's code (stop the group, or restart the actor). Two that once shared 5 made the supervisor stop
a group whose vLLM engine had died, instead of restarting its worker. 2 is also argparse's usage error."""

from __future__ import annotations

# The group's exit code when it could not start (Triton's for "failed to start ... service").
START_FAILED_CODE = 1
# A supervisor or router whose group's lock is held by another live process (deploy/group_lock.py).
GROUP_BUSY_CODE = 2
# The router could not create the server (Triton's "error: creating server"): a repository root it cannot use,
# or a model that failed to load with --exit-on-error. The supervisor stops the whole group with a failure
# instead of restarting the router (which would fail again).
CREATE_FAILED_CODE = 3
# An ingress that could not bind its address (deploy/listen.py).
LISTEN_FAILED_CODE = 4
# A worker whose hosted engine died under it (workers/backends/vllm/engine.py): a failure, so the supervisor (or
# systemd's Restart=on-failure) starts it again, and the router loads its models there again.
ENGINE_DIED_CODE = 5
# An actor that refuses the group's start as Triton's ``tritonserver`` refuses to start an endpoint
# (StartEndpoints fails, Triton exits 1: the Vertex AI default model): the supervisor stops the group.
START_REFUSED_CODE = 6
