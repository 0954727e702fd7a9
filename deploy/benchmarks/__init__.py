"""Benchmarks, run from the repository root as ``python -m conveyor.deploy.benchmarks.<name>`` (``make bench`` runs
``benchmarks.perf``). Not part of the installed package: the wheel holds only ``conveyor.*``."""
