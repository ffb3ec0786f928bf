"""scripts/thread_cost.py: a pass's cost on a serving thread by where the model was loaded, the measurement
spekula.threads and docs/ARCHITECTURE.md (threads.py) cite."""

from __future__ import annotations

import json

import pytest

from scriptkit import loaded


@pytest.fixture(scope="module")
def script():
    with loaded("thread_cost.py") as module:
        yield module


@pytest.mark.model
def test_it_times_each_mode_in_fresh_processes(script, capsys):
    assert script.main(["--rounds", "2", "--passes", "2", "--context", "8", "smollm2-135m"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert set(summary["ms"]) == {"loader", "passing"}
    assert all(len(ms) == 2 and min(ms) > 0 for ms in summary["ms"].values())
    assert "loader: one-token pass" in out and "passing: one-token pass" in out


def test_bad_counts_are_refused(script):
    with pytest.raises(SystemExit):
        script.parse_args(["--passes", "0"])
