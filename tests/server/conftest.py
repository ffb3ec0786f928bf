"""Server tests: loopback only, bounded in time. The fake model is in tests/pipelinekit.py, the runner in
serverkit.py."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """The fake model's tensors are tiny: one thread keeps these tests fast (fixture in tests/conftest.py)."""
