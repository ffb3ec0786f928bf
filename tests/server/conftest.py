"""Server tests: loopback only, bounded in time. See serverkit.py for the fake model and the runner."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The fake model's tensors are tiny: with two intra-op threads on a busy 2-core machine each op
    can wait milliseconds for a descheduled peer. One thread keeps these tests fast; restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
