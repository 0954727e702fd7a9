"""Triton's cloud credential file: ``TRITON_CLOUD_CREDENTIAL_PATH`` names a JSON file with one
section per store (``"s3"``, ``"gs"``, ``"as"``), each keyed by URL prefix; the longest matching
prefix wins, and ``""`` matches every URL."""

from __future__ import annotations

import json
import logging
import os

log = logging.getLogger(__name__)

CREDENTIAL_PATH_ENV = "TRITON_CLOUD_CREDENTIAL_PATH"


def credential_file_entry(kind: str, url: str) -> object:
    """The entry of section ``kind`` for ``url``, or None (no file, no section, no matching prefix)."""
    path = os.environ.get(CREDENTIAL_PATH_ENV, "")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        log.error("cannot read %s %s: %s", CREDENTIAL_PATH_ENV, path, exc)
        return None
    entries = doc.get(kind) if isinstance(doc, dict) else None
    if not isinstance(entries, dict):
        return None
    best = max((p for p in entries if url.startswith(p)), key=len, default=None)
    return entries[best] if best is not None else None


def credential_fields(kind: str, url: str) -> dict[str, str]:
    """A dict-valued entry (``s3``, ``as``) as strings; empty when there is none."""
    entry = credential_file_entry(kind, url)
    if not isinstance(entry, dict):
        return {}
    return {str(k): str(v) for k, v in entry.items() if v is not None}
