"""How an actor leaves: at once, without the interpreter's teardown.

An actor that has closed its sockets and unlinked its arena has nothing left for the interpreter's own
teardown to do but free every module's objects and join thread pools: 0.1-0.2 s of CPU per process, and
seconds of wall time when a whole group (every actor at once) stops on a busy 2-core host. Measured on
``tritonserver`` stopping idle: 3.5-4.1 s with the teardown, 0.7-1.0 s without, on the same loaded host.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Leave without the interpreter's teardown, once the process's own cleanup is done."""
    logging.shutdown()  # the log handlers' buffers (a --log-file) first
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
