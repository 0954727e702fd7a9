"""How a worker stops when the group's exit timeout has run out (the supervisor's side of it
is in ``deploy/supervisor.py``).

Triton waits ``--exit-timeout-secs`` for requests in flight, then unloads every model anyway,
so a Python model's ``finalize`` runs even with a request still open (a test of Triton's
decoupled suite counts its log lines). A worker told this stops draining, unloads its
instances and waits a bounded time for their ``finalize`` before it exits.
"""

from __future__ import annotations

import signal

# The supervisor's word to a worker still draining at the group's deadline: unload now. Not a
# second SIGTERM: two signals of one kind sent together may reach the handler as one.
UNLOAD_NOW_SIGNAL = signal.SIGUSR1

# How long a stopping worker waits for its models' ``finalize`` (and ``close``) to return.
# Triton waits for a model's unload without a bound; a ``finalize`` that hangs (it waits for a
# thread that never ends) must not keep the worker, and with it the group's stop, forever.
FINALIZE_WAIT_S = 5.0

# How long the supervisor lets a worker it told to unload run before killing it: the wait above
# plus the time to leave (flush the logs, close the sockets).
UNLOAD_GRACE_S = FINALIZE_WAIT_S + 2.0
