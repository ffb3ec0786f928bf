"""Fixtures for the bench tests; the helpers live in benchkit.py (a unique module name)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchkit import UNSEEN, ByteCodec, write_jsonl


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices gain nothing from a second thread, and on a busy CI machine two threads spin
    against each other (100x slower); restored afterwards for other test directories."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def codec():
    return ByteCodec()


@pytest.fixture
def unseen_workload(tmp_path) -> Path:
    return write_jsonl(tmp_path / "mine.jsonl", UNSEEN)
