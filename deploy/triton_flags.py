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


def gpu_limit_problem(values: list[str] | None) -> str:
    """Triton's checks of --model-load-gpu-limit <device>:<fraction> (its
    TRITONSERVER_ServerOptionsSetModelLoadDeviceLimit), as its ``tritonserver`` prints them before it exits;
    '' when every value passes. Accepted, the values change nothing (unused_model_load_gpu_limit)."""
    for value in values or []:
        device_text, _, fraction_text = value.partition(":")
        try:
            device, fraction = int(device_text), float(fraction_text)
        except ValueError:
            return f"Failed to parse '{value}' as <int>:<double>"
        if device < 0:
            return f"error: setting model load GPU limit: Invalid argument - expects device ID >= 0, got {device}"
        if not 0.0 <= fraction <= 1.0:
            return ("error: setting model load GPU limit: Invalid argument - expects limit fraction to be in range "
                    f"[0.0, 1.0], got {fraction:f}")
    return ""
