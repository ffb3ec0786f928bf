"""scripts/llama_server_compare.py: the suite split into cold, warm-up and warm sets, the servers' command
lines, and the table of ratios over llama-server's plain decoding."""

from __future__ import annotations

import json

import pytest

from spekula.bench.workloads import TURN, builtin_workload

from scriptkit import loaded


@pytest.fixture(scope="module")
def script():
    with loaded("llama_server_compare.py") as module:
        yield module


def test_the_suite_is_dealt_into_three_disjoint_sets_that_cover_it(script):
    items = builtin_workload()
    sets = script.split_suite(items, seed=0)
    ids = [[i.id for i in s] for s in sets.values()]
    assert sorted(sum(ids, [])) == sorted(i.id for i in items)  # every prompt once
    for category in {i.category for i in items}:  # every category in the measured sets
        assert any(i.category == category for i in sets["A"])
        assert any(i.category == category for i in sets["B"])
    assert script.split_suite(items, seed=0) == sets  # reproducible
    assert script.split_suite(items, seed=1) != sets


def test_an_edit_session_s_turns_stay_together_and_in_order(script):
    for items in script.split_suite(builtin_workload(), seed=3).values():
        ids = [i.id for i in items]
        for position, item_id in enumerate(ids):
            found = TURN.fullmatch(item_id)
            if found and found["turn"] == "1":
                assert ids[position + 1] == f"{found['session']}-turn2"


def test_every_contender_runs_the_same_gguf_with_the_same_threads(script, tmp_path, monkeypatch):
    binary = tmp_path / "llama-server"
    binary.write_text("")
    monkeypatch.setenv("LLAMA_SERVER", str(binary))
    args = script.parse_args([str(tmp_path / "out"), "--threads", "3", "--parallel", "4"])
    servers = {s.name: s for s in script.servers(args, "/models/m.gguf")}
    assert list(servers) == script.DEFAULT_CONTENDERS == [c for c in script.CONTENDERS if c != "spekula-any-rows"]
    assert len({s.port for s in servers.values()}) == len(servers)
    for name in ("llama-server", "ngram-simple", "ngram-mod"):
        argv = servers[name].argv
        assert argv[0] == str(binary) and argv[argv.index("-m") + 1] == "/models/m.gguf"
        assert argv[argv.index("-t") + 1] == "3" and argv[argv.index("-np") + 1] == "4"
    assert "--spec-type" not in servers["llama-server"].argv
    assert servers["ngram-mod"].argv[-2:] == ["--spec-type", "ngram-mod"]
    assert servers["spekula-plain"].argv[-2:] == ["--draft", "none"]
    assert servers["spekula"].argv[servers["spekula"].argv.index("--threads") + 1] == "3"
    every = script.parse_args([str(tmp_path / "out"), "--contenders", ",".join(script.CONTENDERS)])
    any_rows = {s.name: s for s in script.servers(every, "/models/m.gguf")}["spekula-any-rows"].argv
    assert any_rows[-1] == "--prompt-cache-any-rows" and "--draft" not in any_rows


def test_a_missing_llama_server_says_how_to_build_it(script, tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_SERVER", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="make llama-server"):
        script.servers(script.parse_args([str(tmp_path)]), "m.gguf")


def test_the_baseline_cannot_be_left_out(script, tmp_path):
    with pytest.raises(SystemExit):
        script.parse_args([str(tmp_path), "--contenders", "spekula,ngram-mod"])


def test_the_table_is_each_contender_s_median_ratio_over_plain_llama_server(script):
    def row(phase, id_, category, server, tps, text="t"):
        return {"phase": phase, "id": id_, "category": category, "server": server, "tokens_per_s": tps, "text": text}

    rows = []
    for phase in ("cold", "warm"):
        rows += [row(phase, "a", "code", "llama-server", 10.0), row(phase, "a", "code", "spekula", 15.0)]
        rows += [row(phase, "b", "code", "llama-server", 20.0), row(phase, "b", "code", "spekula", 10.0, "other")]
        rows += [row(phase, "c", "chat", "llama-server", 10.0), row(phase, "c", "chat", "spekula", 9.0)]
    text, summary = script.table(rows, ["llama-server", "spekula"])
    assert summary["cold"]["spekula"]["code"] == pytest.approx((1.5 + 0.5) / 2)
    assert summary["warm"]["spekula"]["chat"] == pytest.approx(0.9)
    assert summary["cold"]["spekula"]["all"] == pytest.approx(0.9)  # median of 1.5, 0.5, 0.9
    assert summary["cold"]["spekula"]["same_text_as_plain"] == 2
    assert summary["warm"]["llama-server"]["all"] == 1.0
    assert "| spekula | 0.900 |" in text


def test_the_table_gives_spekula_over_the_faster_n_gram_mode_and_over_its_own_plain_decoding(script):
    rows = []
    for phase in ("cold", "warm"):
        for server, tps in (("llama-server", 10.0), ("ngram-simple", 12.0), ("ngram-mod", 16.0), ("spekula", 14.0)):
            rows.append(
                {"phase": phase, "id": "a", "category": "code", "server": server, "tokens_per_s": tps, "text": "t"}
            )
        plain_text = "t" if phase == "cold" else "u"  # spekula's text and --draft none's differ in the warm phase
        rows.append(
            {"phase": phase, "id": "a", "category": "code", "server": "spekula-plain", "tokens_per_s": 7.0}
            | {"text": plain_text}
        )
    text, summary = script.table(rows, script.DEFAULT_CONTENDERS)
    assert summary["cold"]["spekula over the better n-gram mode"]["code"] == pytest.approx(14 / 16)
    assert summary["warm"]["spekula over spekula-plain"]["all"] == pytest.approx(2.0)
    assert "spekula over spekula-any-rows" not in summary["warm"]
    rows += [{**r, "server": "spekula-any-rows", "tokens_per_s": 17.5} for r in rows if r["server"] == "spekula"]
    _, every = script.table(rows, script.CONTENDERS)  # the history-exact prompt cache against reusing every row
    assert every["cold"]["spekula over spekula-any-rows"]["code"] == pytest.approx(14 / 17.5)
    assert "| spekula over the better n-gram mode | 0.875 | 0.875 | |" in text
    assert "| spekula over spekula-plain | 2.000 | 2.000 | 1/1 as spekula-plain's |" in text.split("warm")[0]
    assert "| spekula over spekula-plain | 2.000 | 2.000 | 0/1 as spekula-plain's |" in text.split("warm")[1]
    cold_only, kept = script.table([r for r in rows if r["phase"] == "cold"], script.DEFAULT_CONTENDERS)
    assert set(kept) == {"cold"} and "warm" not in cold_only  # a run stopped before its warm phase
    _, without = script.table(
        [r for r in rows if r["server"] in ("llama-server", "spekula")], ["llama-server", "spekula"]
    )
    assert set(without["cold"]) == {"llama-server", "spekula"}  # nothing to divide by: no derived rows


def test_the_table_shows_per_category_how_much_spekula_drafted_and_how_much_was_accepted(script):
    def row(id_, category, server, drafting=None):
        r = {"phase": "cold", "id": id_, "category": category, "server": server, "tokens_per_s": 10.0, "text": "t"}
        return {**r, "drafting": drafting} if drafting else r

    def spec(passes, drafts, drafted, accepted):
        return {"target_passes": passes, "drafts": drafts, "drafted": drafted, "accepted": accepted, "k_chosen": {}}

    rows = [row(i, c, "llama-server") for i, c in (("a", "chat"), ("b", "chat"), ("c", "code"))]
    rows += [row(i, c, "spekula-plain", spec(90, 0, 0, 0)) for i, c in (("a", "chat"), ("b", "chat"), ("c", "code"))]
    rows += [row("a", "chat", "spekula", spec(95, 2, 6, 0)), row("b", "chat", "spekula", spec(90, 2, 4, 1))]
    rows += [row("c", "code", "spekula")]  # a run saved before answers kept their drafting
    rows += [{**r, "phase": "warm"} for r in rows]
    text, _ = script.table(rows, ["llama-server", "spekula-plain", "spekula"])
    assert "cold: spekula's drafting" in text and "warm: spekula's drafting" in text
    assert "| contender | chat | code |" in text
    assert "| spekula | 4/185, 0.10 | 0/0 |" in text  # 4 of 185 passes verified a draft, 1 of 10 tokens accepted
    assert "| spekula-plain |" not in text.split("warm: spekula's drafting")[-1]  # it never drafted: no row
    plain, summary = script.table([r for r in rows if r["server"] != "spekula"], ["llama-server", "spekula-plain"])
    assert "drafting" not in plain and summary["warm"]["spekula-plain"]["all"] == 1.0


def test_the_table_shows_spekula_s_ms_a_pass_and_its_scoring_time_over_its_plain_decoding_s(script):
    def row(id_, category, server, score_s=None, passes=0):
        r = {"phase": "cold", "id": id_, "category": category, "server": server, "tokens_per_s": 10.0, "text": "t"}
        if score_s is None:
            return r
        spec = {"target_passes": passes, "drafts": 1, "drafted": 2, "accepted": 1, "k_chosen": {}}
        return {**r, "drafting": {**spec, "timings": {"score_s": score_s}}}

    ids = (("a", "chat"), ("b", "chat"), ("c", "code"))
    rows = [row(i, c, "llama-server") for i, c in ids]
    rows += [row("a", "chat", "spekula-plain", 3.0, 100), row("b", "chat", "spekula-plain", 4.0, 100)]
    rows += [row("c", "code", "spekula-plain", 4.0, 100)]
    rows += [row("a", "chat", "spekula", 3.3, 100), row("b", "chat", "spekula", 4.0, 80)]
    rows += [row("c", "code", "spekula")]  # saved before answers kept their timings: no cell from it
    text, _ = script.table(rows, ["llama-server", "spekula-plain", "spekula"])
    assert "cold: spekula's target passes: ms a pass" in text
    assert "| spekula-plain, ms a pass | 35.0 | 40.0 |" in text  # medians of 30 and 40; 40 ms
    assert "| spekula, ms a pass | 41.5 | - |" in text  # 33 and 50 ms
    # per request 1.1 and 1.0: drafting cost a, saved nothing on b; code has no spekula timing
    assert "| spekula's scoring time over spekula-plain's | 1.050 | - |" in text
    untimed, _ = script.table(
        [{k: v for k, v in r.items() if k != "drafting"} for r in rows], ["llama-server", "spekula"]
    )
    assert "target passes" not in untimed


def test_a_streamed_answer_keeps_what_spekula_s_spec_object_says_it_drafted(script):
    spec = {
        "proposer": "suffix",
        "k": "auto",
        "drafts": 3,
        "drafted": 9,
        "accepted": 7,
        "target_passes": 40,
        "k_chosen": {"0": 37, "3": 3},
        "alpha": 0.78,
        "timings": {
            "prefill_s": 0.3,
            "draft_s": 0.01,
            "score_s": 2.4,
            "accept_s": 0.01,
            "advance_s": 0.0,
            "total_s": 2.8,
        },
    }
    assert script.drafting(spec) == {
        "target_passes": 40,
        "drafts": 3,
        "drafted": 9,
        "accepted": 7,
        "k_chosen": {"0": 37, "3": 3},
        "timings": spec["timings"],  # where the request's time went, by stage
    }


def test_every_contender_s_tokens_are_counted_by_one_rule(script):
    """llama-server counts the end token it sampled in usage.completion_tokens, spekula does not: the same text in
    the same time must give the same rate."""
    words = lambda text: len(text.split())  # noqa: E731  (the target's tokenizer in the script)
    server = {"text": "a b c", "tokens": 4, "seconds": 2.0, "ttft_s": 0.5}
    ours = {"text": "a b c", "tokens": 3, "seconds": 2.0, "ttft_s": 0.5}
    a, b = script.recount(server, words), script.recount(ours, words)
    assert a["tokens"] == b["tokens"] == 3 and a["tokens_per_s"] == b["tokens_per_s"] == 1.5
    assert (a["usage_tokens"], b["usage_tokens"]) == (4, 3)  # the servers' own counts are kept
    assert a["decode_tokens_per_s"] == pytest.approx(2 / 1.5)
    assert script.recount(a, words)["usage_tokens"] == 4  # recounting again keeps the server's count
    unstreamed = script.recount({"text": "a b", "tokens": 3, "seconds": 1.0}, words)
    assert unstreamed["tokens_per_s"] == 2.0 and unstreamed["decode_tokens_per_s"] is None


def test_retable_recounts_a_saved_run(script, tmp_path, monkeypatch):
    monkeypatch.setattr(script, "token_counter", lambda model: lambda text: len(text.split()))
    rows = [
        {"phase": p, "id": "a", "category": "code", "server": s, "text": "x y", "tokens": n, "seconds": 1.0}
        for p in ("cold", "warm")
        for s, n in (("llama-server", 3), ("spekula", 2))
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert script.main([str(tmp_path), "--retable"]) == 0
    assert "| spekula | 1.000 |" in (tmp_path / "table.md").read_text()  # same text, same time: the same rate


def test_a_folder_that_holds_a_run_is_not_written_over(script, tmp_path):
    (tmp_path / "results.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit, match="already holds a run's results: give a new folder"):
        script.main([str(tmp_path)])
    assert (tmp_path / "results.jsonl").read_text() == "{}\n" and not (tmp_path / "commands.txt").exists()


def test_categories_and_each_prompt_s_own_length_can_be_chosen(script, tmp_path, monkeypatch):
    """--categories keeps the suite's prompts of those categories; --max-tokens 0 asks each for the suite's own
    max_tokens, a number caps them all."""
    args = script.parse_args([str(tmp_path), "--categories", "code-editing,repeat-editing", "--max-tokens", "0"])
    items = script.workload(args)
    assert {i.category for i in items} == {"code-editing", "repeat-editing"}
    assert len(items) == sum(i.category in args.categories for i in builtin_workload())
    with pytest.raises(SystemExit):
        script.parse_args([str(tmp_path), "--categories", "code-edit"])
    with pytest.raises(SystemExit):
        script.parse_args([str(tmp_path), "--max-tokens", "-1"])

    asked = []
    monkeypatch.setattr(script, "ask", lambda server, item, max_tokens, salt="": asked.append(max_tokens) or {})
    monkeypatch.setattr(script, "recount", lambda row, count: row)
    server = script.Server("llama-server", [], 0)
    for cap, expected in ((0, [i.max_tokens for i in items]), (96, [min(96, i.max_tokens) for i in items])):
        asked.clear()
        args.max_tokens = cap
        with open(tmp_path / "rows.jsonl", "w") as log:
            script.run_phase("cold", items, [server], args, log, 0, None)
        assert asked == expected
    assert max(i.max_tokens for i in items) > 96  # the two runs differ


def test_each_server_is_ready_before_the_next_starts(script, tmp_path, monkeypatch):
    """A server's load-time measurements (exact mode times its attention ways, docs/decisions/
    0014-attention-way-by-measurement.md) must not run beside another server's start: the contenders start one
    after another, and every one started is stopped when the run ends, here by a failure."""
    import subprocess

    import spekula.models

    events = []

    class Started:
        def __init__(self, argv, **kwargs):
            self.name = argv[0]
            events.append(("start", self.name))

        def terminate(self):
            events.append(("stop", self.name))

        def wait(self, timeout):
            return 0

    class Stop(Exception):
        pass

    def run_phase(*args, **kwargs):
        raise Stop

    live = [script.Server(name, [name], 0) for name in ("llama-server", "ngram-simple", "spekula")]
    monkeypatch.setattr(spekula.models, "resolve", lambda model: type("M", (), {"gguf_path": "/m.gguf"}))
    monkeypatch.setattr(script, "token_counter", lambda model: len)
    monkeypatch.setattr(script, "servers", lambda args, gguf: live)
    monkeypatch.setattr(subprocess, "Popen", Started)
    monkeypatch.setattr(script, "wait_ready", lambda server, timeout: events.append(("ready", server.name)))
    monkeypatch.setattr(script, "model_id", lambda server: "m")
    monkeypatch.setattr(script, "run_phase", run_phase)
    with pytest.raises(Stop):
        script.main([str(tmp_path / "out")])
    names = [s.name for s in live]
    assert events == [(what, n) for n in names for what in ("start", "ready")] + [("stop", n) for n in names]


def test_a_workload_file_of_held_out_prompts_replaces_the_suite(script, tmp_path, monkeypatch):
    """--workload FILE: its prompts (an edit session's turns included) are dealt to the three sets as the suite's
    are and sent, the suite's never; --categories is checked against the file's; a missing file is refused."""
    lines = [{"id": f"chat-{i}", "category": "chat", "prompt": f"question {i}"} for i in range(4)]
    first = [{"role": "user", "content": "edit this"}]
    lines += [
        {"id": "edit-turn1", "category": "edit", "messages": first},
        {
            "id": "edit-turn2",
            "category": "edit",
            "messages": [*first, {"role": "assistant", "content": "done"}, {"role": "user", "content": "again"}],
        },
    ]
    held_out = tmp_path / "held-out.jsonl"
    held_out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = script.parse_args([str(tmp_path / "out"), "--workload", str(held_out)])
    items = script.workload(args)
    assert sorted(i.id for i in items) == sorted(line["id"] for line in lines)
    sets = script.split_suite(items, seed=0)
    assert sorted(i.id for s in sets.values() for i in s) == sorted(line["id"] for line in lines)
    session = next(s for s in sets.values() if any(i.category == "edit" for i in s))
    ids = [i.id for i in session]
    assert ids.index("edit-turn2") == ids.index("edit-turn1") + 1

    sent = []
    monkeypatch.setattr(script, "ask", lambda server, item, max_tokens, salt="": sent.append(item.id) or {})
    monkeypatch.setattr(script, "recount", lambda row, count: row)
    with open(tmp_path / "rows.jsonl", "w") as log:
        script.run_phase("cold", items, [script.Server("llama-server", [], 0)], args, log, 0, None)
    assert sorted(sent) == sorted(line["id"] for line in lines)

    assert script.workload(script.parse_args([str(tmp_path), "--workload", str(held_out), "--categories", "edit"]))
    with pytest.raises(SystemExit):  # a category of the suite, not of the file
        script.parse_args([str(tmp_path), "--workload", str(held_out), "--categories", "code-editing"])
    with pytest.raises(SystemExit):
        script.parse_args([str(tmp_path), "--workload", str(tmp_path / "missing.jsonl")])


def test_a_warm_up_workload_fills_w_and_the_held_out_prompts_are_all_measured(script, tmp_path):
    """--warmup-workload builtin: W is the whole suite, every prompt of --workload lands in A or B (none in W),
    each category in both; a warm-up file that does not load is refused."""
    lines = [{"id": f"{c}-{i}", "category": c, "prompt": f"{c} {i}"} for c in ("chat", "code") for i in range(4)]
    held_out = tmp_path / "held-out.jsonl"
    held_out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = script.parse_args([str(tmp_path / "out"), "--workload", str(held_out), "--warmup-workload", "builtin"])
    sets = script.phase_sets(args)
    assert sorted(i.id for i in sets["A"] + sets["B"]) == sorted(line["id"] for line in lines)
    assert sorted(i.id for i in sets["W"]) == sorted(i.id for i in builtin_workload())
    for category in ("chat", "code"):
        assert [i.category for i in sets["A"]].count(category) == [i.category for i in sets["B"]].count(category) == 2
    without = script.phase_sets(script.parse_args([str(tmp_path / "out"), "--workload", str(held_out)]))
    assert {i.id for i in without["W"]} <= {line["id"] for line in lines} and without["W"]  # a third of the file
    with pytest.raises(SystemExit):
        script.parse_args([str(tmp_path / "out"), "--warmup-workload", str(tmp_path / "missing.jsonl")])
