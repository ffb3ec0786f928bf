"""Server tests: loopback only, bounded in time. See serverkit.py for the fake model and the runner."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """The fake model's tensors are tiny: one thread keeps these tests fast (fixture in tests/conftest.py)."""
