"""`spekula bench` in-process on a workload file nobody wrote the code for: the report's numbers agree
with each other and with the engine, every prompt ran under every configuration, interleaved."""

from __future__ import annotations

import collections
import json
import threading
import time

import pytest

from spekula.bench import commands, runner
from spekula.bench.metrics import merge_stats, tpot
from spekula.bench.runner import SpecChoice, parse_spec
from spekula.bench.workloads import load_workload
from spekula.config import SamplingParams, StopConfig
from spekula.engine import Engine
from spekula.errors import ConfigError
from spekula.trace import RequestStats

from benchkit import UNSEEN, ByteCodec, contenders_for, table, write_jsonl

CHOICES = [SpecChoice("ngram", 4), SpecChoice("same", 3), SpecChoice("random", 2)]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("bench")
    unseen_workload = write_jsonl(tmp_path / "mine.jsonl", UNSEEN)
    target = table(0, work=10)
    drafts = {"same": table(0), "random": table(123, work=10)}  # alpha = 1 and alpha ~ 0
    contenders = contenders_for(target, drafts, CHOICES)
    items = load_workload(unseen_workload)
    result, summary, paths = commands.bench_inprocess(
        contenders,
        ByteCodec(),
        items,
        target_name="table-0",
        models=[{"role": "target", "name": "table-0", "sha256": None}],
        workload_name=str(unseen_workload),
        out_dir=tmp_path / "out",
        max_tokens=20,
        progress=False,
    )
    return target, items, result, summary, paths


def test_every_prompt_under_every_configuration_interleaved(bench_run):
    _, items, result, _, _ = bench_run
    names = [c["name"] for c in result["configs"]]
    assert names == ["plain", "ngram k=4", "same k=3", "random k=2"]
    reqs = result["requests"]
    assert len(reqs) == len(items) * len(names)
    assert sorted(r["order"] for r in reqs) == list(range(len(reqs)))
    by_order = sorted(reqs, key=lambda r: r["order"])
    for i, item in enumerate(items):
        block = by_order[i * len(names) : (i + 1) * len(names)]
        assert {r["prompt_id"] for r in block} == {item.id}  # one prompt under every configuration, then the next
        assert sorted(r["config"] for r in block) == sorted(names)
    firsts = [by_order[i * len(names)]["config"] for i in range(len(items))]
    assert len(set(firsts)) == len(items)  # the configuration that goes first changes
    for i in range(len(items)):  # in the runner's balanced order
        block = [r["config"] for r in by_order[i * len(names) : (i + 1) * len(names)]]
        assert block == runner.balanced_order(names, i)


@pytest.mark.parametrize("n", range(1, 8))
def test_balanced_order_puts_every_contender_in_every_position_and_after_every_other_alike(n):
    contenders = [f"c{i}" for i in range(n)]
    design = 2 * n if n % 2 else n
    for start in (0, 5):  # any run of consecutive rounds as long as the design
        rows = [runner.balanced_order(contenders, start + r) for r in range(design)]
        assert all(sorted(row) == contenders for row in rows)  # each round runs every contender once
        positions = {(c, i) for row in rows for i, c in enumerate(row)}
        assert len(positions) == n * n  # every contender in every position
        follows = collections.Counter((row[i - 1], row[i]) for row in rows for i in range(1, n))
        if n > 1:
            # every ordered pair of different contenders is adjacent, equally often: nobody always
            # runs right after the same contender (a rotation of one fixed order fails this for n > 2)
            assert len(follows) == n * (n - 1) and len(set(follows.values())) == 1


def test_numbers_agree_with_each_other_and_the_engine(bench_run):
    target, items, result, _, _ = bench_run
    reqs = result["requests"]
    plain = {r["prompt_id"]: r for r in reqs if r["config"] == "plain"}
    for r in reqs:
        # speedup is the per-prompt ratio of tokens per second, as `generate --compare` prints it
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / plain[r["prompt_id"]]["tokens_per_s"])
        assert r["tokens_per_s"] == pytest.approx(r["stats"]["output_tokens"] / r["latency_s"])
        # decode-only speedup: the same ratio with each request's prefill left out (the pass that finished
        # the prefill, and the tokens it emitted, are the prefill's)
        base = plain[r["prompt_id"]]["stats"]
        stats = r["stats"]
        assert stats["prefill_output_tokens"] >= 1 and base["prefill_output_tokens"] == 1
        decode = (stats["output_tokens"] - stats["prefill_output_tokens"]) / (r["latency_s"] - stats["prefill_s"])
        assert 0 < stats["prefill_s"] < r["latency_s"] and stats["decode_tokens_per_s"] == pytest.approx(decode)
        base_decode = (base["output_tokens"] - 1) / (base["total_s"] - base["prefill_s"])
        assert r["decode_speedup"] == pytest.approx(decode / base_decode)
        assert r["identical"] is True and r["token_ids"] == plain[r["prompt_id"]]["token_ids"]  # greedy is lossless
        assert r["tpot_s"] == pytest.approx((r["latency_s"] - r["ttft_s"]) / (len(r["token_ids"]) - 1))
        assert r["stats"]["output_tokens"] == len(r["token_ids"])
    codec = ByteCodec()
    for item in items:  # plain decoding in the report is what the engine produces on its own
        ids = item.encode(codec)
        alone = Engine(target).generate(ids, SamplingParams(), StopConfig(max_tokens=item.max_tokens_under(20))).run()
        assert plain[item.id]["token_ids"] == alone.token_ids
    assert plain["mine-2"]["stats"]["output_tokens"] == 12  # the line's own max_tokens (under the cap of 20)

    for name in ("plain", "ngram k=4", "same k=3", "random k=2"):
        o = result["summary"][name]["overall"]
        mine = [r for r in reqs if r["config"] == name]
        drafted = sum(r["stats"]["drafted"] for r in mine)
        accepted = sum(r["stats"]["accepted"] for r in mine)
        passes = sum(r["stats"]["target_passes"] for r in mine)
        tokens = sum(r["stats"]["output_tokens"] for r in mine)
        assert (o["requests"], o["drafted"], o["accepted"], o["output_tokens"]) == (
            len(items),
            drafted,
            accepted,
            tokens,
        )
        assert o["wasted_drafted"] == drafted - accepted
        assert o["alpha"] == (accepted / drafted if drafted else None)
        assert o["tau"] == pytest.approx(1 + accepted / passes)
        assert o["tokens_per_s"] == pytest.approx(tokens / sum(r["latency_s"] for r in mine))
        assert (o["identical_to_plain"], o["compared_to_plain"]) == (len(items), len(items))
        speedups = sorted(r["speedup"] for r in mine)
        assert speedups[0] <= o["speedup"]["median"] <= speedups[-1]
        decode = sorted(r["decode_speedup"] for r in mine)
        assert o["decode_speedup"]["n"] == len(items) and decode[0] <= o["decode_speedup"]["median"] <= decode[-1]
        steps = {}
        for r in mine:
            for k, n in r["stats"]["k_chosen"].items():
                steps[int(k)] = steps.get(int(k), 0) + n
        assert o["steps_by_k"] == steps and sum(steps.values()) == passes
        assert o["cpu_s_per_1k_tokens"] > 0 and o["peak_rss_bytes"] > 0
        assert o["latency_s"]["p50"] <= o["latency_s"]["p90"] <= o["latency_s"]["p99"]
        cats = result["summary"][name]["categories"]
        assert set(cats) == {"repeat", "chat"} and sum(c["requests"] for c in cats.values()) == len(items)
    plain_o = result["summary"]["plain"]["overall"]
    assert (plain_o["tau"], plain_o["alpha"], plain_o["drafted"]) == (1.0, None, 0)
    same = result["summary"]["same k=3"]["overall"]
    assert same["alpha"] == 1.0 and same["acceptance_by_position"] == [1.0, 1.0, 1.0]
    assert result["summary"]["random k=2"]["overall"]["alpha"] < 0.2


def test_outputs_json_html_markdown_and_render(bench_run):
    _, items, result, summary, paths = bench_run
    saved = json.loads(open(paths["results"]).read())
    assert saved["summary"] == json.loads(json.dumps(result["summary"]))
    m = saved["manifest"]
    for key in ("models", "packages", "machine", "config", "seeds", "git", "created"):
        assert key in m
    for key in ("cpu", "cores_logical", "memory_bytes", "gpu"):
        assert key in m["machine"]
    assert m["packages"]["torch"] and m["packages"]["spekula"]
    assert "| same k=3 |" in summary and "### Speedup per category" in summary
    same = saved["summary"]["same k=3"]
    row = next(line for line in summary.splitlines() if line.startswith("| same k=3 |"))
    d = same["overall"]["decode_speedup"]
    assert f"| {d['median']:.3f}x [{d['p10']:.3f}, {d['p90']:.3f}] |" in row  # the decode-only column
    assert ", ".join(f"{k}: {n}" for k, n in same["overall"]["steps_by_k"].items()) in row
    chat = next(line for line in summary.splitlines() if line.startswith("| chat |"))
    assert f"decode {same['categories']['chat']['decode_speedup']['median']:.3f}x" in chat
    html = open(paths["report"]).read()
    assert html.count("data:image/png;base64,") == 4  # speedup per category, acceptance, tau, speedup vs k
    assert "<script" not in html and 'src="http' not in html  # self-contained
    render = saved["render"]
    kinds = {t["kind"] for t in render["tokens"]}
    assert kinds <= {"accepted", "recovered", "bonus", "plain"} and "accepted" in kinds
    assert 'class="tok accepted"' in html
    reqs = [r for r in saved["requests"] if r["config"] == render["config"] and r["prompt_id"] == render["prompt_id"]]
    assert [t["token"] for t in render["tokens"]] == reqs[0]["token_ids"]
    assert "".join(t["text"] for t in render["tokens"]) == reqs[0]["text"]


def test_sampled_run_uses_one_seed_per_prompt_for_every_configuration(tmp_path, unseen_workload):
    target = table(0)
    contenders = contenders_for(target, {"same": table(0)}, [SpecChoice("same", 2)])
    items = load_workload(unseen_workload)
    result, _, _ = commands.bench_inprocess(
        contenders,
        ByteCodec(),
        items,
        target_name="t",
        models=[],
        workload_name="w",
        out_dir=tmp_path / "o",
        sampling=SamplingParams(temperature=1.0, seed=5),
        max_tokens=8,
        progress=False,
        repeats=2,
    )
    assert len(result["requests"]) == 2 * 2 * len(items)
    assert all(r["identical"] is None for r in result["requests"])  # identity is a greedy notion
    assert result["summary"]["same k=2"]["overall"]["compared_to_plain"] is None
    again, _, _ = commands.bench_inprocess(
        contenders,
        ByteCodec(),
        items,
        target_name="t",
        models=[],
        workload_name="w",
        out_dir=tmp_path / "o2",
        sampling=SamplingParams(temperature=1.0, seed=5),
        max_tokens=8,
        progress=False,
        repeats=2,
    )
    assert [r["token_ids"] for r in again["requests"]] == [r["token_ids"] for r in result["requests"]]


def test_parse_spec():
    assert parse_spec("draft=ngram,k=2/4/8", "d", 4) == [
        SpecChoice("ngram", 2),
        SpecChoice("ngram", 4),
        SpecChoice("ngram", 8),
    ]
    assert parse_spec("k=3", "qwen2.5-coder-0.5b", None) == [SpecChoice("qwen2.5-coder-0.5b", 3)]
    assert parse_spec("", "qwen", None) == [SpecChoice("qwen", None)]
    assert parse_spec("k=auto", "qwen", 4)[0].name == "qwen k=auto"
    assert parse_spec("draft=ngram,k=5,ngram_max=3,name=lookup", "d", 4) == [SpecChoice("ngram", 5, 3, 1, "lookup")]
    assert [c.name for c in parse_spec("draft=ngram,k=2/3,name=x", "d", 4)] == ["x k=2", "x k=3"]
    assert SpecChoice("/models/my-draft/", 4).name == "my-draft k=4"
    for bad in (
        "draft",
        "colour=red",
        "k=two",
        "k=1,k=2",
        "k=-1",
        "draft=ngram,ngram_max=x",
        "confidence=high",
        "confidence=1.5",
    ):
        with pytest.raises(ConfigError):
            parse_spec(bad, "d", 4)
    # shadow drafts: off unless the spec turns them on (an A/B of what they are worth, in one run)
    (lit,) = parse_spec("draft=suffix,k=auto,shadow=on", "d", None)
    assert lit.name == "suffix k=auto shadow=on" and lit.spec_config().shadow_drafts is True
    assert parse_spec("draft=suffix,k=auto", "d", None)[0].spec_config().shadow_drafts is False
    with pytest.raises(ConfigError, match="on or off"):
        parse_spec("draft=suffix,shadow=no", "d", None)
    # a draft model's confidence threshold: from the spec, else from --draft-confidence; never for n-gram lookup
    (sure,) = parse_spec("k=auto,confidence=0.4", "qwen", None)
    assert sure.confidence == 0.4 and sure.name == "qwen k=auto conf=0.4" and sure.spec_config().draft_confidence == 0.4
    assert parse_spec("k=auto", "qwen", None, confidence=0.3)[0].confidence == 0.3
    assert parse_spec("draft=ngram,k=auto", "qwen", None, confidence=0.3)[0].confidence is None
    with pytest.raises(ConfigError, match="not a draft model"):
        parse_spec("draft=ngram,confidence=0.4", "qwen", None)
    # k=auto's longest draft: from the spec, else from --k-max; named only where it is not the default
    (short,) = parse_spec("draft=ngram,k=auto,k_max=8", "qwen", None)
    assert short.k_max == 8 and short.name == "ngram k=auto k_max=8" and short.spec_config().k_max == 8
    assert parse_spec("draft=ngram", "qwen", None, k_max=4)[0].spec_config().k_max == 4
    assert parse_spec("draft=ngram", "qwen", None)[0].name == "ngram k=auto"
    for bad in ("k_max=0", "k_max=65", "k_max=x", "k=4,k_max=8", "k=auto/4,k_max=8"):
        with pytest.raises(ConfigError, match="k_max"):
            parse_spec(bad, "qwen", None)


def test_duplicate_configurations_are_refused():
    with pytest.raises(ConfigError, match="given twice"):
        contenders_for(table(0), {}, [SpecChoice("ngram", 4), SpecChoice("ngram", 4)])


def test_named_plain_configuration_runs_as_an_a_a_control(tmp_path):
    """`--spec draft=none,name=plain-again`: plain decoding once more under its own name, so the run
    shows how far noise alone moves a ratio; an unnamed plain choice is the baseline, not a copy."""
    choices = [SpecChoice("none", 0), SpecChoice("none", 0, label="plain-again"), SpecChoice("ngram", 4)]
    contenders = contenders_for(table(0, work=2), {}, choices)
    assert [c.name for c in contenders] == ["plain", "plain-again", "ngram k=4"]
    assert [c.plain for c in contenders] == [True, True, False]
    items = load_workload(write_jsonl(tmp_path / "w.jsonl", UNSEEN[:2]))
    result, markdown, _ = commands.bench_inprocess(
        contenders,
        ByteCodec(),
        items,
        target_name="table-0",
        models=[],
        workload_name="w",
        out_dir=tmp_path / "out",
        max_tokens=8,
        progress=False,
    )
    again = [r for r in result["requests"] if r["config"] == "plain-again"]
    assert len(again) == len(items)
    for r in again:
        assert r["identical"] is True and r["speedup"] > 0
        assert r["stats"]["drafted"] == 0 and r["stats"]["target_passes"] == r["stats"]["output_tokens"]
    assert result["summary"]["plain-again"]["overall"]["identical_to_plain"] == len(items)
    assert "| plain-again |" in markdown


def test_the_warm_up_leaves_each_contender_its_own_target_cache(tmp_path, monkeypatch):
    """A runtime whose caches cost time to make (a llama.cpp context: ~0.3 s) keeps released ones for the next
    sequence. The warm-up must make as many as the contenders hold at once, so no measured request pays for
    one: each contender's prompt cache keeps its sequence open between its requests."""
    target = table(0)
    live, peak = [0], {"warm-up": 0, "measured": 0}
    phase = ["warm-up"]
    real_new = target.new_sequence

    def new_sequence():
        seq = real_new()
        live[0] += 1
        peak[phase[0]] = max(peak[phase[0]], live[0])
        real_release = seq.release

        def release():
            live[0] -= 1
            real_release()

        seq.release = release
        return seq

    real_measure = runner.measure

    def measure(*args, **kwargs):
        phase[0] = "measured"
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(target, "new_sequence", new_sequence)
    monkeypatch.setattr(runner, "measure", measure)
    choices = [SpecChoice("none", 0), SpecChoice("none", 0, label="plain-again"), SpecChoice("ngram", 4)]
    items = load_workload(write_jsonl(tmp_path / "w.jsonl", UNSEEN[:3]))
    runner.run_inprocess(contenders_for(target, {}, choices), ByteCodec(), items, max_tokens=4, progress=False)
    assert peak["warm-up"] == len(choices)  # one cache per contender, made before any measured request
    assert 0 < peak["measured"] <= peak["warm-up"]


def test_merge_stats_sums_what_adds_up():
    a, b = (
        RequestStats(prompt_tokens=3, ttft_s=0.1, total_s=1.0),
        RequestStats(prompt_tokens=4, ttft_s=0.2, total_s=3.0),
    )
    a.record_step(4, 4, 4, 5)
    b.record_step(4, 2, 1, 2)
    b.record_step(4, 0, 0, 1)
    m = merge_stats([a, b])
    assert (m.prompt_tokens, m.output_tokens, m.target_passes, m.drafted, m.accepted) == (7, 8, 3, 6, 5)
    assert m.drafted_per_position == [2, 2, 1, 1] and m.accepted_per_position == [2, 1, 1, 1]
    assert m.k_chosen == {4: 3} and m.total_s == 4.0 and m.ttft_s is None
    assert m.alpha == 5 / 6 and m.tau == 1 + 5 / 3 and m.tokens_per_s == 2.0
    assert tpot(a) == pytest.approx(0.9 / 4) and tpot(RequestStats(output_tokens=1, ttft_s=0.1, total_s=0.1)) is None


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel-peak", "sampled"])
def test_peak_rss_sees_a_request_s_peak_and_forgets_it_at_reset(kernel):
    if kernel and not runner.PeakRss._kernel_peak_works():
        pytest.fail("this Linux has no resettable peak RSS (/proc/self/clear_refs): the bench would sample it")
    mib = 1 << 20
    with runner.PeakRss(interval=0.001, kernel=kernel) as rss:
        assert (rss._thread is None) == kernel  # the kernel keeps the peak: no sampler runs beside the request
        rss.reset()
        before = rss.peak()
        block = bytearray(256 * mib)
        for i in range(0, len(block), 4096):  # touch every page: resident, not just reserved
            block[i] = 1
        in_use = rss.current()
        if not kernel:  # until the sampler has seen the block (a condition, with a deadline, not a guessed sleep)
            deadline = time.monotonic() + 10
            while rss._peak < in_use - mib and time.monotonic() < deadline:
                threading.Event().wait(rss.interval)
        del block
        # the kernel's RSS counters are per-CPU caches, synced every few dozen page faults: ~1 MiB of slack
        assert rss.peak() >= before + 200 * mib and rss.peak() >= in_use - mib
        rss.reset()
        assert rss.peak() < before + 100 * mib
