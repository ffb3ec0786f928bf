"""Fixtures for the bench tests; the helpers live in benchkit.py (a unique module name)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchkit import UNSEEN, ByteCodec, write_jsonl


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny matrices gain nothing from a second thread (fixture in tests/conftest.py)."""


@pytest.fixture
def codec():
    return ByteCodec()


@pytest.fixture
def unseen_workload(tmp_path) -> Path:
    return write_jsonl(tmp_path / "mine.jsonl", UNSEEN)
