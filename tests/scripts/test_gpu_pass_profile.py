"""scripts/experiments/gpu_pass_profile.py in its CPU smoke mode: the pass costs docs/BENCHMARKS.md (GPU) cites."""

from __future__ import annotations

import re

import pytest

from scriptkit import loaded

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_it_times_every_width_then_profiles(capsys):
    with loaded("experiments/gpu_pass_profile.py") as script:
        assert script.main(["--tiny", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    timed = re.findall(r"^S=(\d+): ([\d.]+) ms a pass$", out, flags=re.M)
    assert [int(w) for w, _ in timed] == [1, 2, 5, 9, 17] and all(float(ms) > 0 for _, ms in timed)
    assert "--- S=1, 5 passes, by cpu_time_total" in out and "--- S=5, 5 passes, by cpu_time_total" in out
