"""Fixtures of the deploy tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield str(tmp_path_factory.mktemp("run"))
