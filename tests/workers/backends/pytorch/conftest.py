"""The TorchScript tests' model builders, which need torch."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture()
def torch_models() -> Any:
    # Skip on torch alone: an import error in the builders themselves must fail, not skip.
    pytest.importorskip("torch", reason="torch is not installed (pip install conveyor[torch])")
    from tests.support import torch_models

    return torch_models
