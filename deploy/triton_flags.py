"""Triton's flags that have no work to do in Conveyor's design: accepted, so that an
existing ``tritonserver`` command line runs as it is, and logged once at start with
the reason each changes nothing.

They are declared with the rest in ``settings.py`` (``Setting.unused`` holds the
reason); docs/DEPLOY.md has the whole table.
"""

from __future__ import annotations

import argparse
import logging

from conveyor.deploy.settings import Setting, TritonUnused, unused

log = logging.getLogger("conveyor.flags")

UNUSED: tuple[Setting, ...] = unused()


def unused_given(a: TritonUnused | argparse.Namespace) -> list[str]:
    """One line for each unused flag on this command line."""
    out = []
    for u in UNUSED:
        value = getattr(a, u.name, None)
        if value is None or value == []:
            continue
        shown = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
        out.append(f"{u.flags[0]}={shown}: accepted, not used by Conveyor because {u.unused}")
    return out


def log_unused(a: TritonUnused, extra: list[str]) -> None:
    for line in [*unused_given(a), *extra]:
        log.warning("%s", line)
