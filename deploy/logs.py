"""Log format per place: timestamps on a terminal, syslog priorities under journald.

journald stamps every line itself and reads a ``<N>`` prefix as the line's
priority (``SyslogLevelPrefix=``, on by default), so ``journalctl -p warning``
works. It tells the service where its stream is through ``$JOURNAL_STREAM``
(``device:inode``); stderr is only taken to be that stream when they match, so a
child whose stderr was redirected elsewhere still gets timestamps.
"""

from __future__ import annotations

import os
import sys

from conveyor.deploy.runtime.log_settings import JournalFormatter, LogSettings, ProcessLog

__all__ = ["JournalFormatter", "setup_logging", "stderr_is_journal"]

def stderr_is_journal() -> bool:
    stream = os.environ.get("JOURNAL_STREAM", "")
    if not stream:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


def setup_logging(settings: LogSettings, role: str) -> None:
    """Log as ``role`` with ``settings`` (the --log-* flags); the router may change them later."""
    ProcessLog.role = role
    ProcessLog.journal = stderr_is_journal()
    ProcessLog.apply(settings)
