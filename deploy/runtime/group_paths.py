"""Where a group's processes find each other on this host: the folder of its IPC sockets, and the
variable in their environment that names the group (set by the supervisor, inherited by whatever an
actor starts: ``deploy/lifeline.py``)."""

from __future__ import annotations

import os
import tempfile

# Where the IPC sockets live. systemd units set RuntimeDirectory=conveyor, which
# exports RUNTIME_DIRECTORY=/run/conveyor; CONVEYOR_RUN_DIR overrides both.
RUN_DIR_ENV = "CONVEYOR_RUN_DIR"
GROUP_MEMBER_ENV = "CONVEYOR_GROUP_MEMBER"  # the group a process, or the actor that started it, belongs to
# ... and that group's run folder: two groups of one name with other run folders (CONVEYOR_RUN_DIR) are two groups.
GROUP_DIR_ENV = "CONVEYOR_GROUP_DIR"


def run_dir(group: str) -> str:
    """The folder of this group's IPC sockets: ``<base>/<group>`` for a configured base,
    else ``$TMPDIR/conveyor-<group>``."""
    base = os.environ.get(RUN_DIR_ENV) or os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if base:
        return os.path.join(base, group)
    return os.path.join(tempfile.gettempdir(), f"conveyor-{group}")
