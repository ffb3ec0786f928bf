"""`spekula tune` recommends plain decoding where speculation loses and speculation where it wins,
and writes a config file that `spekula generate --config` accepts.

Timing-insensitive by construction: the target does a fixed amount of real arithmetic per pass
(like a memory-bound language model, verifying k + 1 tokens costs about one pass). The winning draft
is the target's own table with no extra work (alpha = 1: ~k + 1 tokens per pass); the losing one is
a different table that costs 3 target passes per drafted token (alpha ~ 0: each step pays k of
those and still emits one token). The margins are several-fold, far beyond machine noise."""

from __future__ import annotations

import json

from spekula.bench import commands
from spekula.bench.runner import SpecChoice
from spekula.bench.tune import CONFIG_KEYS
from spekula.bench.workloads import load_workload
from spekula.cli import parser_and_commands
from spekula.options import load_config_file

from benchkit import ByteCodec, contenders_for, table

WORK = 12


def run_tune(tmp_path, workload, drafts, choices):
    contenders = contenders_for(table(0, work=WORK), drafts, choices)
    return commands.tune(
        contenders,
        choices,
        ByteCodec(),
        load_workload(workload),
        target_name="table-0",
        dtype="float32",
        models=[],
        workload_name="w",
        out_dir=tmp_path / "out",
        config_path=tmp_path / "tuned.json",
        max_tokens=16,
        progress=False,
    )


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
