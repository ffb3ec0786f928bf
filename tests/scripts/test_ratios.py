"""scripts/ratios.py: a bench run's ratios over any of its configurations, per category."""

from __future__ import annotations

import gzip
import json

import pytest

from scriptkit import loaded


@pytest.fixture(scope="module")
def script():
    with loaded("ratios.py") as module:
        yield module


def request(config, prompt, category, tps, decode, tpot, passes=10, out=20, error=None):
    stats = {"decode_tokens_per_s": decode, "target_passes": passes, "output_tokens": out}
    return {"config": config, "prompt_id": prompt, "category": category, "repeat": 0, "error": error,
            "tokens_per_s": tps, "tpot_s": tpot, "stats": stats}  # fmt: skip


REQUESTS = [
    request("plain", "a1", "a", 10.0, 12.0, 0.1, passes=20),
    request("fast", "a1", "a", 20.0, 30.0, 0.05, passes=5),
    request("plain", "a2", "a", 10.0, 10.0, 0.1, passes=20),
    request("fast", "a2", "a", 15.0, None, 0.08, passes=15),  # no decode-only rate (e.g. another program's loop)
    request("plain", "b1", "b", 8.0, 8.0, 0.1),
    request("fast", "b1", "b", 4.0, 4.0, 0.2, error="boom"),  # errored: left out
]


def test_medians_of_per_prompt_ratios_by_category_and_overall(script):
    rows = {row["category"]: row["fast"] for row in script.table(REQUESTS, "plain", ["fast"])}
    assert rows["a"]["whole"] == pytest.approx((2.0 + 1.5) / 2) and rows["a"]["decode"] == pytest.approx(2.5)
    assert rows["a"]["tpot"] == pytest.approx((0.5 + 0.8) / 2) and rows["a"]["tau"] == pytest.approx(40 / 20)
    assert rows["b"]["whole"] is None and rows["b"]["prompts"] == 0
    assert rows["all"] == rows["a"]


def test_the_command_reads_gzip_and_prints_markdown(script, tmp_path, capsys):
    path = tmp_path / "results.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"requests": REQUESTS}, f)
    assert script.main([str(path), "--over", "plain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| category (over plain) | fast:") and lines[2] == "| a | 1.750x, 2.500x; 0.650; 2.00 |"
    assert lines[3] == "| b | n/a, n/a; n/a; n/a |"
    with pytest.raises(SystemExit):
        script.main([str(path), "--over", "plain", "--configs", "nope"])


def test_the_interval_of_a_median_resamples_prompts_with_their_repeats(script):
    assert script.median_interval({}) is None
    same = script.median_interval({"a": [1.0, 1.0], "b": [1.0]})
    assert same == (1.0, 1.0)  # nothing varies: nothing to be unsure of
    low, high = script.median_interval({f"p{i}": [0.9 + 0.02 * i, 0.91 + 0.02 * i] for i in range(10)})
    assert 0.9 <= low < 0.99 < high <= 1.09  # the median of all 20 ratios is ~0.995, and it is not pinned
    # one prompt drawn many times moves the median: its repeats travel together
    wide = script.median_interval({"slow": [0.5, 0.5, 0.5], "fast": [1.5, 1.5, 1.5]})
    assert wide == (0.5, 1.5)
    assert script.median_interval({"a": [0.9, 1.1]}, seed=1) == script.median_interval({"a": [0.9, 1.1]}, seed=1)


def test_the_command_prints_the_interval_on_request(script, tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"requests": REQUESTS}))
    assert script.main([str(path), "--over", "plain", "--interval"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "whole [95% interval]" in lines[0]
    assert lines[2] == "| a | 1.750x [1.500, 2.000], 2.500x; 0.650; 2.00 |"  # a1 2.0x, a2 1.5x: drawn alone or together
    assert lines[3] == "| b | n/a, n/a; n/a; n/a |"


def test_the_header_names_the_proposer_memory_the_figures_are_for(script, tmp_path, capsys):
    """A warm run (`spekula bench --warm`) reads like any other; its table says it is warm, an older file nothing."""
    warm = [dict(r, prompt_id=f"{r['prompt_id']}~again1") for r in REQUESTS]  # resent prompts' ids
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"requests": warm, "proposer_memory": {"state": "warm", "prefix_requests": 200}}))
    assert script.main([str(path), "--over", "plain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| category (over plain; proposer memory warm) | fast:")
    assert lines[2] == "| a | 1.750x, 2.500x; 0.650; 2.00 |"
