"""Benchmark scripts run from the source tree; not a package of the wheel (see pyproject.toml)."""
