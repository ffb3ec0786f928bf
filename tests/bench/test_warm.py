"""`spekula bench --warm`: one long mixed sequence with one proposer memory per configuration, as on a server that
has been running; its prefix runs unreported, and every figure says which memory it is for."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from spekula.bench import commands
from spekula.bench.runner import PLAIN, SERVER, SpecChoice, run_inprocess
from spekula.bench.workloads import (
    BUILTIN_CATEGORIES,
    RESEND_LINES,
    RESENT,
    TURN,
    ServerSequence,
    WorkItem,
    builtin_workload,
    load_workload,
    server_sequence,
    split_sequence,
)
from spekula.cli import main
from spekula.errors import ConfigError

from benchkit import ByteCodec, contenders_for, table, write_jsonl

K = 8
RATIOS = Path(__file__).resolve().parents[2] / "scripts" / "ratios.py"


def origin(item: WorkItem) -> str:
    """The id of the prompt an item was made from: a resent prompt's `~againN` taken out."""
    found = TURN.fullmatch(item.id)
    if found:
        return f"{found['session'].split('~again')[0]}-turn{found['turn']}"
    return item.id.split("~again")[0]


# -- the sequence -----------------------------------------------------------------------------------


def test_a_server_sequence_is_reproducible_and_mixes_every_category():
    items = builtin_workload()
    seq = server_sequence(items, prefix=50, requests=60, seed=0)
    assert len(seq.prefix) == 50 and len(seq.reported) == 60
    assert server_sequence(items, prefix=50, requests=60, seed=0) == seq
    assert server_sequence(items, prefix=50, requests=60, seed=1).reported != seq.reported
    assert set(BUILTIN_CATEGORIES) <= {i.category for i in seq.reported}
    assert RESENT in {i.category for i in seq.reported} and RESENT in {i.category for i in seq.prefix}
    assert seq.categories() == [*BUILTIN_CATEGORIES, RESENT]  # the suite's order, not the shuffled one
    ids = [i.id for i in seq.prefix + seq.reported]
    assert len(set(ids)) == len(ids)  # every request has an id of its own: results key on it


def test_reported_prompts_are_new_to_the_server_except_the_resent_ones():
    seq = server_sequence(builtin_workload(), prefix=120, requests=70, seed=4)
    before = {origin(i) for i in seq.prefix}
    fresh = [i for i in seq.reported if i.category != RESENT]
    assert fresh and not {origin(i) for i in fresh} & before
    sent: set[str] = set()
    for item in seq.prefix + seq.reported:  # a resent prompt was sent, as itself, earlier in the sequence
        if item.category == RESENT:
            assert origin(item) in sent, item.id
        else:
            sent.add(item.id)


def test_a_resent_prompt_is_the_earlier_one_with_a_line_in_front():
    by_id = {i.id: i for i in builtin_workload()}
    seq = server_sequence(builtin_workload(), prefix=30, requests=40, seed=2, resend=0.5)
    resent = [i for i in seq.prefix + seq.reported if i.category == RESENT]
    assert resent
    for item in resent:
        first, original = item.chat_messages()[0]["content"], by_id[origin(item)].chat_messages()
        line, rest = first.split("\n", 1)
        assert line in RESEND_LINES and rest == original[0]["content"]
        assert item.chat_messages()[1:] == original[1:] and item.max_tokens == by_id[origin(item)].max_tokens


def test_a_session_s_turns_stay_together_and_in_order():
    seq = server_sequence(builtin_workload(), prefix=60, requests=80, seed=3, resend=0.4)
    for part in (seq.prefix, seq.reported):
        ids = [i.id for i in part]
        for n, item_id in enumerate(ids):
            found = TURN.fullmatch(item_id)
            if found and found["turn"] == "2":
                assert n > 0 and ids[n - 1] == f"{found['session']}-turn1", item_id
            elif found and n + 1 < len(ids):
                assert ids[n + 1] == f"{found['session']}-turn2", item_id


def test_without_resends_the_prefix_and_the_reported_part_split_the_workload():
    items = builtin_workload()
    whole = server_sequence(items, prefix=0, resend=0.0)
    assert sorted(i.id for i in whole.reported) == sorted(i.id for i in items) and whole.prefix == ()
    held = len(server_sequence(items, prefix=1, resend=0.0).reported)
    seq = server_sequence(items, prefix=len(items) - held, resend=0.0)
    assert sorted(i.id for i in seq.prefix + seq.reported) == sorted(i.id for i in items)
    for category in BUILTIN_CATEGORIES:  # each category dealt to both parts
        assert any(i.category == category for i in seq.prefix) and any(i.category == category for i in seq.reported)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"prefix": -1}, "--warm takes"),
        ({"prefix": 5, "resend": 1.0}, "--resend"),
        ({"prefix": 5, "requests": 0}, "--requests"),
    ],
)
def test_bad_sequence_options_are_refused(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        server_sequence(builtin_workload(), **kwargs)


def test_one_prompt_cannot_both_warm_up_and_be_reported():
    one_each = [next(i for i in builtin_workload() if i.category == c) for c in BUILTIN_CATEGORIES[:3]]
    with pytest.raises(ConfigError, match="at least two of some category"):
        server_sequence(one_each, prefix=3)
    assert len(server_sequence(one_each, prefix=0, resend=0.0).reported) == 3


def test_split_sequence_never_cuts_a_session():
    seq = server_sequence(builtin_workload(), prefix=0, seed=5)
    for parts in (2, 3, 7):
        chunks = split_sequence(list(seq.reported), parts)
        assert len(chunks) == parts and sum(chunks, []) == list(seq.reported)
        for chunk in chunks[1:]:
            assert not chunk[0].id.endswith("-turn2")
    with pytest.raises(ConfigError, match="lower --repeats"):
        split_sequence(list(seq.reported[:2]), 3)


# -- the in-process runner --------------------------------------------------------------------------


def tale(item_id: str, line: str = "", category: str = "tale") -> WorkItem:
    return WorkItem(item_id, category, prompt=f"{line}Once upon a time there was")


SEQ = ServerSequence(
    prefix=(tale("tale"), WorkItem("code", "code", prompt="def add(a, b):")),
    reported=(tale("tale~again1", "Again, please:\n", RESENT), WorkItem("sum", "code", prompt="def total(xs):")),
    seed=0,
    resend=0.2,
    category_order=("tale", "code", RESENT),
)


def suffix_contenders():
    """Plain decoding and two suffix configurations over a random table (its outputs rarely repeat themselves, so
    drafts come from the memory of earlier requests)."""
    return contenders_for(table(0), {}, [SpecChoice("suffix", K), SpecChoice("suffix", 4)])


def test_a_warm_run_drafts_from_the_prefix_and_each_configuration_from_its_own_memory():
    contenders = suffix_contenders()
    entries = {}

    def seen(r):  # each speculative configuration's memory when its request finished: its own requests only
        if r.config != PLAIN:
            c = next(c for c in contenders if c.name == r.config)
            entries[(r.config, r.prompt_id)] = c.pipeline.engine.proposer.cache.entries

    warm = run_inprocess(
        contenders, ByteCodec(), list(SEQ.reported), max_tokens=40, ignore_eos=True, progress=False,
        warm_prefix=list(SEQ.prefix), on_result=seen,
    )  # fmt: skip
    cold = run_inprocess(
        suffix_contenders(), ByteCodec(), list(SEQ.reported), max_tokens=40, ignore_eos=True, progress=False
    )
    tau = {(r.config, r.prompt_id, "warm"): r.stats.tau for r in warm}
    tau |= {(r.config, r.prompt_id, "cold"): r.stats.tau for r in cold}
    for name in ("suffix k=8", "suffix k=4"):
        assert tau[(name, "tale~again1", "warm")] > 2.5 > tau[(name, "tale~again1", "cold")]
        assert [entries[(name, i.id)] for i in SEQ.reported] == [3, 4]  # 2 prefix requests, then its own
    assert {r.requests_before for r in warm if r.prompt_id == "sum"} == {3}
    assert {r.requests_before for r in cold if r.prompt_id == "sum"} == {1}
    for c in contenders[1:]:
        assert SERVER not in c.pipeline.engine.proposer.cache.namespaces()  # forgotten once the run is over


def test_the_prefix_runs_only_under_configurations_that_learn(monkeypatch):
    contenders = suffix_contenders()
    started = Counter()
    for c in contenders:
        real = c.start
        monkeypatch.setattr(c, "start", lambda *a, _c=c, _real=real, **k: started.update([_c.name]) or _real(*a, **k))
    run_inprocess(
        contenders, ByteCodec(), list(SEQ.reported), max_tokens=8, progress=False, warm_prefix=list(SEQ.prefix)
    )
    # one start-up request each, the 2 reported ones each, and the 2 prefix requests under the suffix ones only
    assert started == {PLAIN: 3, "suffix k=8": 5, "suffix k=4": 5}


def test_a_warm_run_has_one_repeat():
    with pytest.raises(ConfigError, match="Drop --repeats"):
        run_inprocess(suffix_contenders(), ByteCodec(), list(SEQ.reported), repeats=2, warm_prefix=[])


def test_results_say_which_memory_every_figure_is_for(tmp_path):
    seq = server_sequence(load_workload(write_jsonl(tmp_path / "w.jsonl", PROMPTS)), prefix=4, requests=6, seed=1)
    result, summary, paths = commands.bench_inprocess(
        suffix_contenders()[:2], ByteCodec(), list(seq.reported), target_name="table-0", models=[],
        workload_name="w", out_dir=tmp_path / "warm", max_tokens=12, progress=False, warm=seq,
    )  # fmt: skip
    memory = result["proposer_memory"]
    assert memory["state"] == "warm" and memory["prefix_requests"] == 4 and memory["requests_before"] == [4, 9]
    assert result["manifest"]["proposer_memory"] == memory and memory["prefix_ids"] == [i.id for i in seq.prefix]
    assert [r["requests_before"] for r in result["requests"] if r["config"] == PLAIN] == list(range(4, 10))
    assert result["summary"]["suffix k=8"]["overall"]["requests_before"] == [4, 9]
    assert "Proposer memory: **warm**" in summary and "α; warm)" in summary
    assert result["workload"]["categories"] == seq.categories()
    cold, cold_summary, _ = commands.bench_inprocess(
        suffix_contenders()[:2], ByteCodec(), list(seq.reported), target_name="table-0", models=[],
        workload_name="w", out_dir=tmp_path / "cold", max_tokens=12, progress=False,
    )  # fmt: skip
    assert cold["proposer_memory"]["state"] == "cold" and cold["manifest"]["proposer_memory"]["state"] == "cold"
    assert "Proposer memory: **cold**" in cold_summary
    with pytest.raises(ConfigError, match="reported part"):
        commands.bench_inprocess(
            suffix_contenders()[:2], ByteCodec(), list(seq.prefix), target_name="t", models=[], workload_name="w",
            out_dir=tmp_path / "x", progress=False, warm=seq,
        )  # fmt: skip
    spec = importlib.util.spec_from_file_location("ratios", RATIOS)  # the ratios script reads a warm run as any
    ratios = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ratios)
    rows = {row["category"]: row for row in ratios.table(ratios.load(Path(paths["results"])), PLAIN, ["suffix k=8"])}
    assert set(rows) == {*seq.categories(), "all"}
    assert rows["all"]["suffix k=8"]["prompts"] == 6


PROMPTS = [
    {"id": f"{kind}-{n}", "category": kind, "prompt": f"{kind} number {n}: once upon a time"}
    for kind in ("story", "code")
    for n in range(5)
]


# -- the command line -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--requests", "5"], "Add --warm"),
        (["--resend", "0.5"], "add --warm"),
        (["--warm", "3", "--repeats", "2"], "Drop --repeats"),
    ],
)
def test_the_command_refuses_what_would_not_be_warm(extra, words, tmp_path, unseen_workload, capsys):
    args = ["bench", "--workload", str(unseen_workload), "--target", "no-such-model", "--out", str(tmp_path)]
    assert main(args + extra) != 0  # refused before any model is loaded
    assert words in capsys.readouterr().err


# -- endpoints --------------------------------------------------------------------------------------


def test_an_endpoint_gets_the_prefix_first_then_the_reported_part_in_phases(tmp_path, capsys):
    from fake_openai import Served, make_app

    bodies: dict[str, list[str]] = {"a": [], "b": []}

    def server(name, choices):
        contender = contenders_for(table(0), {}, choices)[-1]
        record = lambda body: bodies[name].append(body["prompt"]) or None  # noqa: E731
        return Served(make_app(contender, ByteCodec(), fault=record))

    workload = write_jsonl(tmp_path / "w.jsonl", PROMPTS)
    with server("a", []) as a, server("b", [SpecChoice("suffix", K)]) as b:
        args = ["bench", "--endpoint", b.url, "--baseline-endpoint", a.url, "--workload", str(workload)]
        args += ["--warm", "4", "--requests", "6", "--repeats", "2", "--max-tokens", "8", "--no-progress"]
        assert main(args + ["--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    line = json.loads(out[-1])
    assert line["proposer_memory"] == "warm"
    result = json.loads(open(line["results"]).read())
    seq = server_sequence(load_workload(workload), prefix=4, requests=6)
    sent = [i.prompt for i in seq.prefix + seq.reported]
    assert bodies["a"] == bodies["b"] == sent  # every server: the prefix, then the reported part, in order, once
    reqs = result["requests"]
    assert not any(r["error"] for r in reqs)
    assert sorted(r["prompt_id"] for r in reqs if r["config"] == "endpoint") == sorted(i.id for i in seq.reported)
    assert sorted({r["repeat"] for r in reqs}) == [0, 1]  # two phases over consecutive parts
    memory = result["manifest"]["proposer_memory"]
    assert memory["state"] == "warm" and memory["prefix_errors"] == {"baseline": 0, "endpoint": 0}
    assert "whatever it learnt before this run" in memory["rule"]
    assert {r["requests_before"] for r in reqs if r["prompt_id"] == seq.reported[-1].id} == {9}
