"""scripts/round_profile.py: where a lone request's scheduler round goes (spekula serve's time per token at
concurrency 1)."""

from __future__ import annotations

import json

import pytest

from scriptkit import loaded


@pytest.fixture(scope="module")
def script():
    with loaded("round_profile.py") as module:
        yield module


def test_it_times_passes_and_rounds_for_each_kept_mode(script, capsys):
    serve = ["--", "--target", "smollm2-135m", "--threads", "2", "--draft", "none", "--no-exact"]
    assert script.main(["--prompts", "2", "--max-tokens", "4", "--kept", "one,many", "--top", "3", *serve]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert [m["kept"] for m in summary["modes"]] == ["one", "many"]
    for mode in summary["modes"]:
        assert mode["one_row_passes"] > 0 and 0 < mode["one_row_pass_ms"] <= mode["round_ms"]
        assert mode["rounds"] >= 2 * 3 and 0 < mode["pass_share"] <= 1  # 2 prompts x (prefill + 3 steps) at least
    assert "tottime" in out and "decode" in out  # the profile lists llama.cpp's decode


def test_bad_modes_are_refused(script):
    with pytest.raises(SystemExit):
        script.parse(["--kept", "two"])
