"""The worker-wide switch for running batches on the main thread (see ``workers/inline.py``)."""

from __future__ import annotations

import logging
import threading

from conveyor.proto.errors import ConveyorError, Status

log = logging.getLogger(__name__)


class InlineSwitch:
    """Turned off for good when a batch run on the main thread makes a call that
    needs the main loop (a BLS call through a module ``inline_allowed`` could not
    see): that call fails with a retryable error, later batches run on their
    instance's thread."""

    on = True

    @classmethod
    def refuse_on_main_thread(cls, what: str) -> None:
        """Raise UNAVAILABLE (and stop inline batches) if called on the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return
        if cls.on:
            cls.on = False
            log.warning("a model made a %s on the worker's main thread: batches no longer run there", what)
        raise ConveyorError(
            Status.UNAVAILABLE,
            f"a {what} from a batch run on the worker's main thread cannot be answered; later batches run on "
            "the instance's own thread: retry the request",
        )
