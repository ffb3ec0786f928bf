"""`spekula tune` recommends plain decoding where speculation loses and speculation where it wins,
and writes a config file that `spekula generate --config` accepts.

Timing-insensitive by construction: the target does a fixed amount of real arithmetic per pass
(like a memory-bound language model, verifying k + 1 tokens costs about one pass). The winning draft
is the target's own table with no extra work (alpha = 1: ~k + 1 tokens per pass); the losing one is
a different table that costs 3 target passes per drafted token (alpha ~ 0: each step pays k of
those and still emits one token). The margins are several-fold, far beyond machine noise."""

from __future__ import annotations

import json

import pytest

from spekula.bench.runner import SpecChoice
from spekula.bench.tune import CONFIG_KEYS
from spekula.cli import parser_and_commands
from spekula.options import load_config_file

from benchkit import ByteCodec, contenders_for, table, tune_over

WORK = 24  # a pass's arithmetic: enough that the winning draft's margin is the loop's, not the machine's noise


def run_tune(tmp_path, workload, drafts, choices):
    contenders = contenders_for(table(0, work=WORK), drafts, choices)
    return tune_over(contenders, choices, workload, tmp_path)


def test_recommends_plain_when_speculation_loses(tmp_path, unseen_workload):
    choices = [SpecChoice("slow-random", 2), SpecChoice("slow-random", 4)]
    outcome, text, paths = run_tune(tmp_path, unseen_workload, {"slow-random": table(123, work=3 * WORK)}, choices)
    assert outcome["recommended"] == "plain"
    assert outcome["config"]["draft"] == "none" and outcome["config"]["k"] == 0
    rows = {r["name"]: r for r in outcome["table"]}
    assert rows["slow-random k=2"]["throughput_ratio"] < 1 and rows["slow-random k=4"]["throughput_ratio"] < 1
    assert "recommended: plain decoding" in text
    assert json.loads((tmp_path / "tuned.json").read_text()) == outcome["config"]


def test_recommends_speculation_when_it_wins(tmp_path, unseen_workload):
    choices = [SpecChoice("same", 2), SpecChoice("same", 4), SpecChoice("ngram", 4)]
    outcome, text, _ = run_tune(tmp_path, unseen_workload, {"same": table(0)}, choices)
    assert outcome["recommended"] in ("same k=2", "same k=4")
    best = next(r for r in outcome["table"] if r["name"] == outcome["recommended"])
    assert best["throughput_ratio"] > 1.5 and best["alpha"] == 1.0
    assert (
        outcome["table"][0]["name"] == "plain" and outcome["table"][1]["name"] == outcome["recommended"]
    )  # fastest first
    config = json.loads((tmp_path / "tuned.json").read_text())
    assert tuple(config) == CONFIG_KEYS
    assert config["draft"] == "same" and config["k"] == best["k"] and config["target"] == "table-0"
    assert "| same k=" in text and "(recommended)" in text


def test_config_file_is_what_generate_reads(tmp_path, unseen_workload):
    choices = [SpecChoice("same", 3, confidence=0.3, k_max=5)]
    run_tune(tmp_path, unseen_workload, {"same": table(0)}, choices)
    parser, commands = parser_and_commands()
    generate = commands["generate"]
    options = set(vars(parser.parse_args(["generate", "hello"])))
    assert set(CONFIG_KEYS) <= options
    values = load_config_file(str(tmp_path / "tuned.json"), options)
    generate.set_defaults(**values)
    args = parser.parse_args(["generate", "hello"])
    assert (args.draft, args.k, args.target, args.temperature) == ("same", 3, "table-0", 0.0)
    assert (args.draft_confidence, args.k_max) == (0.3, 5)  # the tuned configuration as it was measured


# -- runtimes ---------------------------------------------------------------------------------------


def test_the_default_sweep_stays_on_the_runs_runtime():
    from spekula.bench.tune import sweep_choices

    own = sweep_choices(["ngram", "none"], [2, 0, None], runtime="llamacpp")
    assert [c.name for c in own] == ["ngram k=2", "ngram k=auto"]
    assert all(c.backend is None for c in own)
    both = sweep_choices(["ngram"], [2], backends=["llamacpp", "native"], runtime="llamacpp")
    assert [c.name for c in both] == ["ngram k=2", "plain backend=native", "ngram k=2 backend=native"]


def run_two_runtimes(tmp_path, workload, own_work, other_work):
    """The run's runtime (recorded as llamacpp) and 'native', each a table of the same numbers whose
    passes cost `own_work` / `other_work` matrix products: the cheaper runtime is the faster one."""
    from spekula.bench.runner import build_contenders

    other = table(0, work=other_work, name="table-0@native")

    def load_runtime(runtime, exact=None):
        assert runtime == "native"
        return other, lambda name: table(0)

    choices = [SpecChoice("ngram", 2), SpecChoice("none", 0, backend="native")]
    contenders = build_contenders(table(0, work=own_work), ByteCodec(), choices, None, load_runtime)
    return tune_over(contenders, choices, workload, tmp_path, dtype="bfloat16", runtime="llamacpp")


def test_a_faster_runtime_is_recommended_by_name_and_recorded(tmp_path, unseen_workload):
    outcome, text, _ = run_two_runtimes(tmp_path, unseen_workload, own_work=4 * WORK, other_work=WORK)
    assert outcome["recommended"] == "plain backend=native"
    assert outcome["runtime"] == "native" and "runtime: native" in text
    config = json.loads((tmp_path / "tuned.json").read_text())
    assert (config["backend"], config["draft"], config["k"], config["dtype"]) == ("native", "none", 0, "bfloat16")
    row = next(r for r in outcome["table"] if r["name"] == "plain backend=native")
    assert row["throughput_ratio"] > 2  # a quarter of the work per pass


def test_the_runs_own_runtime_is_recorded_when_it_wins(tmp_path, unseen_workload):
    outcome, text, _ = run_two_runtimes(tmp_path, unseen_workload, own_work=WORK, other_work=4 * WORK)
    assert outcome["recommended"] in ("plain", "ngram k=2")
    config = json.loads((tmp_path / "tuned.json").read_text())
    assert config["backend"] == "llamacpp" and config["dtype"] == "float32"  # llama.cpp: the GGUF's own types
    assert "runtime: llamacpp" in text


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_generate_and_serve_run_on_the_recorded_runtime(tmp_path, unseen_workload, command):
    run_two_runtimes(tmp_path, unseen_workload, own_work=4 * WORK, other_work=WORK)
    parser, commands_ = parser_and_commands()
    argv = [command, "hello"] if command == "generate" else [command]
    options = set(vars(parser.parse_args(argv))) - {"func", "command", "config"}
    assert set(CONFIG_KEYS) <= options
    commands_[command].set_defaults(**load_config_file(str(tmp_path / "tuned.json"), options))
    args = parser.parse_args(argv)
    assert (args.backend, args.draft, args.k, args.exact) == ("native", "none", 0, False)


def test_cli_sweeps_the_runtimes_it_is_given_and_emits(tmp_path, unseen_workload, monkeypatch, capsys):
    """`spekula tune --backends ... --emit ...` end to end, with the model loading replaced by tables."""
    import spekula.bench.cli as bench_cli
    from spekula.bench.runner import build_contenders
    from spekula.cli import main

    swept = []

    def fake_load(args, choices):
        swept.extend(c.name for c in choices)
        contenders = build_contenders(table(0), ByteCodec(), choices, None, lambda runtime, exact: (table(0), None))
        return contenders, ByteCodec(), []

    monkeypatch.setattr(bench_cli, "load_contenders", fake_load)
    argv = ["tune", "--target", "t", "--drafts", "ngram", "--ks", "2", "--backend", "llamacpp"]
    argv += ["--workload", str(unseen_workload), "--max-tokens", "8", "--out", str(tmp_path / "out"), "--no-progress"]
    assert main([*argv, "--backends", "llamacpp,native", "--emit", "vllm"]) == 0
    assert swept == ["ngram k=2", "plain backend=native", "ngram k=2 backend=native"]
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["runtime"] in ("llamacpp", "native") and last["config"]["backend"] == last["runtime"]
    assert (tmp_path / "out" / "emit-vllm.sh").read_text().startswith("# vllm:")
    swept.clear()
    assert main(argv) == 0  # the default: the run's runtime only
    assert swept == ["ngram k=2"]
