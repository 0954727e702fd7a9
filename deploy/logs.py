"""Log format per place: timestamps on a terminal, syslog priorities under journald.

journald stamps every line itself and reads a ``<N>`` prefix as the line's
priority (``SyslogLevelPrefix=``, on by default), so ``journalctl -p warning``
works. It tells the service where its stream is through ``$JOURNAL_STREAM``
(``device:inode``); stderr is only taken to be that stream when they match, so a
child whose stderr was redirected elsewhere still gets timestamps.
"""

from __future__ import annotations

import logging
import os
import sys

# syslog(3) priorities of the logging levels.
_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


def stderr_is_journal() -> bool:
    stream = os.environ.get("JOURNAL_STREAM", "")
    if not stream:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


class JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        priority = _PRIORITY.get(record.levelno, 6 if record.levelno < logging.WARNING else 3)
        return f"<{priority}>{super().format(record)}"


def setup_logging(verbose: int, role: str) -> None:
    level = logging.DEBUG if verbose > 0 else logging.INFO
    handler = logging.StreamHandler()
    if stderr_is_journal():
        # journald adds the time, the unit and the pid: keep the line to what only we know.
        handler.setFormatter(JournalFormatter(f"{role} %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {role}[%(process)d] %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
