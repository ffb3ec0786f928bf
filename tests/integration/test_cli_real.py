"""`spekula generate` end to end on a small real model."""

from __future__ import annotations

import importlib.util
import json

import pytest

from spekula.cli import main

# the native runtime in fp32: greedy speculative output equals plain decoding token for token
SMALL = ["--target", "smollm2-135m", "--max-tokens", "16", "--dtype", "float32", "--backend", "native"]


def last_json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("draft,runtime", [("smollm2-135m", "native"), ("smollm2-135m", None), ("ngram", None)])
def test_json_compare_is_identical_in_greedy_fp32(capsys, draft, runtime):
    """The target drafting for itself in the same runtime (alpha = 1); the default draft runtime
    (llama.cpp's Q4 of the same model: lower alpha, same output); n-gram lookup."""
    extra = ["--draft-backend", runtime] if runtime else []
    assert (
        main(["generate", "def fibonacci(n):", *SMALL, "--draft", draft, *extra, "--k", "4", "--json", "--compare"])
        == 0
    )
    out = last_json(capsys)
    assert out["identical"] is True
    assert out["token_ids"] == out["baseline"]["token_ids"] and len(out["token_ids"]) == 16
    for key in ("drafted", "accepted", "alpha", "tau", "target_passes", "tokens_per_s", "ttft_s"):
        assert key in out["stats"]
    assert out["speedup"] == pytest.approx(out["stats"]["tokens_per_s"] / out["baseline"]["tokens_per_s"])
    if runtime == "native":
        assert out["stats"]["alpha"] == 1.0


def test_auto_k_is_the_default_and_reports_its_choice(capsys):
    assert main(["generate", "def add(a, b):", *SMALL, "--draft", "smollm2-135m", "--json"]) == 0
    stats = last_json(capsys)["stats"]
    assert stats["k_chosen"] and stats["predicted_speedup"] is not None and stats["plain_pass_s"] > 0


def test_trace_file_has_a_record_per_step(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    assert (
        main(
            ["generate", "import os\n", *SMALL, "--draft", "smollm2-135m", "--k", "3", "--trace", str(trace), "--json"]
        )
        == 0
    )
    out = last_json(capsys)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    steps = [r for r in records if r["type"] == "step"]
    assert len(steps) == out["stats"]["target_passes"]
    assert sum(len(s["emitted"]) for s in steps) == 16
    assert all({"drafted", "accepted", "next_token", "next_kind", "timings"} <= set(s) for s in steps)
    assert all(d["q"] is not None and 0 <= d["p"] <= 1 for s in steps for d in s["drafted"])
    assert records[-1]["type"] == "request" and records[-1]["token_ids"] == out["token_ids"]


def test_stop_string_and_human_output(capsys):
    assert main(["generate", "1, 2, 3, 4,", *SMALL, "--draft", "ngram", "--k", "2", "--stop", "7"]) == 0
    out = capsys.readouterr().out
    assert "7" not in out.split("-" * 60)[0]
    assert "alpha" in out and "tau" in out


def test_config_file_sets_defaults_and_flags_win(tmp_path, capsys):
    cfg = tmp_path / "tuned.json"
    cfg.write_text(json.dumps({"draft": "ngram", "k": 2}))
    assert main(["generate", "x = 1\n", *SMALL, "--config", str(cfg), "--k", "3", "--json"]) == 0
    config = last_json(capsys)["config"]
    assert (config["draft"], config["k"]) == ("ngram", 3)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--target", "no-such-model"], "no-such-model"),
        (["--target", "smollm2-135m", "--draft", "qwen2.5-coder-0.5b"], "vocabular"),
        (["--target", "smollm2-135m", "--top-p", "1.5"], "top_p must be in"),
        (["--target", "smollm2-135m", "--k", "-1"], "k (draft length) must be"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(capsys, argv, message):
    assert main(["generate", "hi", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "exact, kind",
    [(["--no-exact"], "identical-except-near-ties"), ([], "bit-identical"), (["--exact"], "bit-identical")],
)
def test_a_llama_cpp_target_says_which_guarantee_its_output_has(capsys, exact, kind):
    """Exact mode is the default: bit-identical unless --no-exact."""
    argv = ["generate", "def f():", "--target", "smollm2-135m", "--backend", "llamacpp", "--draft", "ngram", "--k", "2"]
    assert main([*argv, "--max-tokens", "4", *exact]) == 0
    text = capsys.readouterr().out
    bit_identical = kind == "bit-identical"
    assert ("nearly tie" in text) == (not bit_identical) and ("bit for bit" in text) == bit_identical
    assert main([*argv, "--max-tokens", "4", *exact, "--json"]) == 0
    assert last_json(capsys)["guarantee"]["kind"] == kind


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is installed by make setup")
def test_a_builtin_target_runs_on_llama_cpp_by_default_on_a_cpu(capsys):
    assert (
        main(["generate", "def f():", "--target", "smollm2-135m", "--draft", "none", "--max-tokens", "4", "--json"])
        == 0
    )
    out = last_json(capsys)
    assert out["config"]["backend"] == "llamacpp" and len(out["token_ids"]) == 4
