"""scripts/batch_costs.py: the cost of one batched llama.cpp pass by shape, the measurement that
docs/decisions/0006-shared-context-flash-attention.md, docs/SERVER.md and the shared context's attention choice
(llamacpp.SHARED_FLASH_ATTENTION) cite."""

from __future__ import annotations

import argparse
import json

import pytest

from spekula.backends import llamacpp

from scriptkit import loaded


@pytest.fixture(scope="module")
def script():
    with loaded("batch_costs.py") as module:
        yield module


def test_it_times_each_shape_on_a_real_gguf(script, capsys, monkeypatch):
    monkeypatch.setattr(llamacpp, "SHARED_FLASH_ATTENTION", True)  # the script sets it; the test puts it back
    argv = ["--shapes", "1x1,3x2", "--context", "8", "--repeats", "1", "--threads", "2", "--attention", "default"]
    assert script.main([*argv, "smollm2-135m"]) == 0
    assert llamacpp.SHARED_FLASH_ATTENTION is False
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("1 x 1: ") and lines[1].startswith("3 x 2: ")
    summary = json.loads(lines[-1])
    assert set(summary["ms"]) == {"1x1", "3x2"} and all(ms > 0 for ms in summary["ms"].values())
    assert summary["attention"] == "default" and summary["context"] == 8


@pytest.mark.parametrize("text", ["", "4", "1x0", "ax1", "1x2x3"])
def test_bad_shapes_are_refused(script, text):
    with pytest.raises(argparse.ArgumentTypeError, match="BxS"):
        script.shapes(text)
