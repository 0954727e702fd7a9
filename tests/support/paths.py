"""Where the repository's own files are, for tests that read them (units, manifests, docs)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
