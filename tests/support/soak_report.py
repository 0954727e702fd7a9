"""Lines the soak test reports; ``conftest.pytest_terminal_summary`` prints them
after the run (so they show without ``-s``), as it does the fuzz case counts."""

from __future__ import annotations

LINES: list[str] = []
