"""Test fixtures that build real artefacts on the fly (no downloads)."""
