"""Endpoint mode on loopback: two deployments of a tiny OpenAI-compatible server (plain and
speculative), measured side by side with the openai client; and the endpoint audit."""

from __future__ import annotations

import asyncio
import json

import pytest

from spekula.bench.audit import AuditReport, compare_texts, format_report
from spekula.bench.endpoint import Endpoint, Load, _sse_events, borrow_token_counts, normalise_url, run_endpoint
from spekula.bench.metrics import RequestResult, attach_comparisons, summarise_by_config
from spekula.bench.runner import SpecChoice
from spekula.bench.workloads import load_workload
from spekula.cli import main
from spekula.config import SamplingParams
from spekula.errors import ConfigError
from spekula.trace import RequestStats

from benchkit import ByteCodec, contenders_for, table
from fake_openai import FAULTS, Served, make_app


@pytest.fixture(scope="module")
def servers():
    """plain: the target alone; spec: the same target with a draft; other: a different target."""
    codec = ByteCodec()
    plain, spec = contenders_for(table(0), {"same": table(0)}, [SpecChoice("same", 3)])
    other = contenders_for(table(7), {}, [])[0]
    with Served(make_app(plain, codec)) as a, Served(make_app(spec, codec)) as b, Served(make_app(other, codec)) as c:
        yield {"plain": a.url, "spec": b.url, "other": c.url}


def broken_server(fault: str, when: str = ""):
    """The plain target behind a server that breaks (fault, see fake_openai.FAULTS) every request whose body
    mentions `when` ("" = every request)."""
    plain = contenders_for(table(0), {}, [])[0]
    return Served(make_app(plain, ByteCodec(), fault=lambda body: fault if when in json.dumps(body) else None))


def last_json(capsys):
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1]), "\n".join(out)


def test_bench_two_endpoints_side_by_side(servers, unseen_workload, tmp_path, capsys):
    rc = main(
        [
            "bench",
            "--endpoint",
            servers["spec"],
            "--baseline-endpoint",
            servers["plain"],
            "--workload",
            str(unseen_workload),
            "--concurrency",
            "2",
            "--requests",
            "6",
            "--max-tokens",
            "10",
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
        ]
    )
    assert rc == 0
    line, text = last_json(capsys)
    assert line["kind"] == "spekula-bench" and line["mode"] == "endpoint" and line["baseline"] == "baseline"
    assert set(line["configs"]) == {"baseline", "endpoint"}
    mine = line["configs"]["endpoint"]
    assert (mine["identical"], mine["compared"], mine["errors"]) == (6, 6, 0)  # greedy outputs equal across deployments
    assert "| endpoint |" in text and "| baseline |" in text
    result = json.loads(open(line["results"]).read())
    reqs = result["requests"]
    assert len(reqs) == 12  # bounded: --requests per endpoint, the workload's 4 prompts cycled
    assert all(r["token_count_source"] == "usage" and r["ttft_s"] is not None for r in reqs)
    assert {r["repeat"] for r in reqs} == {0, 1}
    base = {(r["prompt_id"], r["repeat"]): r for r in reqs if r["config"] == "baseline"}
    for r in reqs:
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / base[(r["prompt_id"], r["repeat"])]["tokens_per_s"])
        assert r["decode_speedup"] is None  # an endpoint's prefill is not timed apart: no decode-only ratio is invented
    over = result["summary"]["endpoint"]["overall"]
    assert over["decode_speedup"]["n"] == 0 and over["steps_by_k"] == {}
    assert over["throughput_tokens_per_s"] > 0 and over["output_tokens"] == sum(
        r["stats"]["output_tokens"] for r in reqs if r["config"] == "endpoint"
    )
    assert (
        result["manifest"]["models"][0]["name"] == "fake-model"
        and result["manifest"]["config"]["load"]["concurrency"] == 2
    )
    assert "data:image/png;base64," in open(line["report"]).read()


def test_repeats_alternate_which_endpoint_goes_first(servers, unseen_workload, tmp_path, capsys, monkeypatch):
    """--repeats: phase after phase, one endpoint at a time, the order flipping each phase (a drift in
    the machine's speed favours neither); each request is compared within its phase."""
    from spekula.bench import commands

    phases: list[tuple[str, int]] = []
    real = commands.run_endpoint

    def spied(endpoint, items, *args, first_repeat=0, **kwargs):
        phases.append((endpoint.name, first_repeat))
        return real(endpoint, items, *args, first_repeat=first_repeat, **kwargs)

    monkeypatch.setattr(commands, "run_endpoint", spied)
    args = ["bench", "--endpoint", servers["spec"], "--baseline-endpoint", servers["plain"]]
    args += ["--workload", str(unseen_workload), "--requests", "6", "--max-tokens", "6", "--repeats", "3"]
    assert main(args + ["--concurrency", "2", "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    line, _ = last_json(capsys)

    order = ["baseline", "endpoint", "endpoint", "baseline", "baseline", "endpoint"]
    assert phases == [(name, 2 * (i // 2)) for i, name in enumerate(order)]  # 6 requests: 2 passes over 4 prompts
    reqs = json.loads(open(line["results"]).read())["requests"]
    assert len(reqs) == 36 and line["configs"]["endpoint"]["compared"] == 18
    for name in ("baseline", "endpoint"):
        mine = [r for r in reqs if r["config"] == name]
        assert sorted({r["repeat"] for r in mine}) == list(range(6))
        assert len({(r["prompt_id"], r["repeat"]) for r in mine}) == 18  # no request counted twice
    assert line["configs"]["endpoint"]["identical"] == 18

    phases.clear()
    seen: list[str] = []
    monkeypatch.setattr(
        commands,
        "run_endpoint",
        lambda ep, items, *a, **k: seen.append(json.dumps(items[0].chat_messages())) or spied(ep, items, *a, **k),
    )
    assert main(args[:-2] + ["--repeats", "2", "--salt", "--out", str(tmp_path / "salted"), "--no-progress"]) == 0
    line, _ = last_json(capsys)
    assert len(seen) == 4 and seen[0] == seen[1] != seen[2] == seen[3]  # both endpoints, each phase its own
    assert "phase 1]" in seen[0] and "phase 2]" in seen[2]
    assert line["configs"]["endpoint"]["identical"] == line["configs"]["endpoint"]["compared"] > 0
    assert main(["bench", "--workload", str(unseen_workload), "--salt"]) == 2  # in-process: refused
    with pytest.raises(ConfigError, match="--repeats must be >= 1"):
        commands.bench_endpoints(
            Endpoint("e", servers["plain"]), None, [], Load(), workload_name="w", out_dir=tmp_path, repeats=0
        )


def test_time_limit_and_failures_are_bounded(servers, unseen_workload):
    items = load_workload(unseen_workload)
    results, wall, model = run_endpoint(
        Endpoint("e", servers["plain"]),
        items,
        SamplingParams(),
        Load(requests=50, time_limit_s=1e-6),
        max_tokens=4,
        progress=False,
    )
    assert model == "fake-model" and len(results) < 50  # nothing starts after the time limit
    dead = Endpoint("dead", "http://127.0.0.1:9", model="m")  # nothing listens on the discard port
    results, _, _ = run_endpoint(
        dead, items, SamplingParams(), Load(requests=2, request_timeout_s=5), max_tokens=4, progress=False
    )
    assert len(results) == 2 and all(r.error for r in results)
    with pytest.raises(ConfigError, match="pass --model"):
        run_endpoint(
            Endpoint("dead", "http://127.0.0.1:9"), items, SamplingParams(), Load(request_timeout_s=5), progress=False
        )
    assert normalise_url("http://h:1/") == "http://h:1/v1" and normalise_url("http://h:1/v1") == "http://h:1/v1"


def test_audit_endpoints(servers, unseen_workload, tmp_path, capsys):
    args = ["audit", "--workload", str(unseen_workload), "--max-tokens", "10", "--no-progress"]
    rc = main(
        args + ["--endpoint", servers["spec"], "--baseline-endpoint", servers["plain"], "--out", str(tmp_path / "a")]
    )
    line, text = last_json(capsys)
    assert rc == 0 and line["passed"] is True and "4/4 outputs identical" in text
    saved = json.loads(open(line["results"]).read())
    assert saved["passed"] and saved["manifest"]["models"][0]["url"] == servers["spec"]
    rc = main(
        args + ["--endpoint", servers["other"], "--baseline-endpoint", servers["plain"], "--out", str(tmp_path / "b")]
    )
    line, text = last_json(capsys)
    assert rc == 1 and line["passed"] is False and "DIFFERENT" in text and "audit: FAIL" in text


def test_cli_refuses_half_an_endpoint_pair(unseen_workload, capsys):
    assert main(["audit", "--workload", str(unseen_workload), "--endpoint", "http://127.0.0.1:9"]) == 2
    assert "needs both --endpoint" in capsys.readouterr().err
    assert main(["bench", "--workload", str(unseen_workload), "--baseline-endpoint", "http://127.0.0.1:9"]) == 2
    assert main(["bench", "--workload", str(unseen_workload), "--waves"]) == 2  # in-process: one request at a time
    assert "--waves is for --endpoint runs" in capsys.readouterr().err


# -- an answer counts only when it is whole -------------------------------------------------------

WHY = {
    "truncate": "ended without a finish_reason and [DONE] after 1 text chunk(s)",
    "no_finish": "ended without a finish_reason after",
    "no_done": "ended without [DONE] after",
    "error_event": "the stream carried an error event: the engine failed",
    "empty": "an empty completion (finish_reason 'stop') where up to 10 tokens were asked for",
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_stream_that_is_not_whole_is_an_error(fault, unseen_workload):
    items = load_workload(unseen_workload)
    with broken_server(fault) as s:
        results, _, _ = run_endpoint(
            Endpoint("e", s.url),
            items,
            SamplingParams(),
            Load(requests=4, concurrency=2),
            max_tokens=10,
            progress=False,
        )
    assert len(results) == 4
    for r in results:
        assert not r.ok and "IncompleteResponse" in r.error and WHY[fault] in r.error, r.error
    summary = summarise_by_config(results, ["e"], {"e": 1.0})["e"]["overall"]
    assert (summary["requests"], summary["errors"], summary["output_tokens"]) == (0, 4, 0)
    assert summary["throughput_tokens_per_s"] is None  # never 0 tokens / wall as if the server were slow but sound


def test_bench_counts_a_broken_baseline_as_errors_and_leaves_its_prompts_out_of_every_column(
    servers,
    unseen_workload,
    tmp_path,
    capsys,
):
    """The baseline truncates one prompt's stream: that is an error on its side, the measured side's run of the
    same prompt is excluded, and every column of both rows covers the same three prompts."""
    with broken_server("truncate", when="the cat sat") as broken:
        rc = main(
            [
                "bench",
                "--endpoint",
                servers["spec"],
                "--baseline-endpoint",
                broken.url,
                "--workload",
                str(unseen_workload),
                "--concurrency",
                "2",
                "--max-tokens",
                "10",
                "--out",
                str(tmp_path / "out"),
                "--no-progress",
            ]
        )
    assert rc == 0
    line, text = last_json(capsys)
    base, mine = line["configs"]["baseline"], line["configs"]["endpoint"]
    assert (base["errors"], base["excluded"], mine["errors"], mine["excluded"]) == (1, 0, 0, 1)
    assert (mine["identical"], mine["compared"]) == (3, 3)  # over the three prompts both sides answered whole
    assert base["tokens_per_s"] is None and mine["tokens_per_s"] is None  # the wall time holds the failed request
    assert "- baseline: 1 error(s), 0 excluded, 3 counted; first: IncompleteResponse: the stream ended without" in text
    assert "- endpoint: 0 error(s), 1 excluded, 3 counted" in text
    result = json.loads(open(line["results"]).read())
    counted = {}
    for name in ("baseline", "endpoint"):
        reqs = [r for r in result["requests"] if r["config"] == name and r["prompt_id"] != "mine-2" and not r["error"]]
        counted[name] = reqs
        over = result["summary"][name]["overall"]
        assert over["requests"] == len(reqs) == 3
        assert over["output_tokens"] == sum(r["stats"]["output_tokens"] for r in reqs)
        assert over["latency_s"]["mean"] == pytest.approx(sum(r["latency_s"] for r in reqs) / 3)
        assert over["ttft_s"]["mean"] == pytest.approx(sum(r["ttft_s"] for r in reqs) / 3)
    assert result["summary"]["endpoint"]["overall"]["speedup"]["n"] == 3
    assert [r["prompt_id"] for r in result["requests"] if r["error"]] == ["mine-2"]


def test_audit_with_a_broken_side_is_incomplete_never_a_pass(servers, unseen_workload, tmp_path, capsys):
    args = [
        "audit",
        "--workload",
        str(unseen_workload),
        "--max-tokens",
        "10",
        "--no-progress",
        "--endpoint",
        servers["spec"],
    ]
    with broken_server("no_done", when="colours") as broken:
        rc = main(args + ["--baseline-endpoint", broken.url, "--out", str(tmp_path / "a")])
    line, text = last_json(capsys)
    assert rc == 1 and line["passed"] is False
    assert "3/3 outputs identical" in text and "INCOMPLETE" in text
    assert "1 failed; their prompts are not compared" in text
    assert "audit: FAIL (1 endpoint request(s) failed)" in text
    saved = json.loads(open(line["results"]).read())
    assert [(e["config"], e["prompt_id"]) for e in saved["endpoint_errors"]] == [("baseline", "colours")]
    with broken_server("empty") as a, broken_server("empty") as b:  # two servers of empty answers
        rc = main(args[:-1] + [a.url, "--baseline-endpoint", b.url, "--out", str(tmp_path / "b")])
    line, text = last_json(capsys)
    assert rc == 1 and line["passed"] is False and "outputs identical" not in text  # nothing is claimed between empties
    assert len(json.loads(open(line["results"]).read())["endpoint_errors"]) == 8


def test_identity_is_never_claimed_between_two_empty_texts():
    def result(config, text):
        return RequestResult("p", "c", config, RequestStats(output_tokens=len(text), total_s=1.0), text, None)

    rs = [result("base", ""), result("spec", ""), result("spec2", "a")]
    attach_comparisons(rs, "base", greedy=True)
    assert [r.identical for r in rs] == [None, None, False]
    case = compare_texts("spec", "p", "", "")
    assert not case.identical
    report = AuditReport(0.01, endpoint_greedy=[case])
    assert not report.passed and "NOTHING TO COMPARE: spec on p: both outputs are empty" in format_report(report)


def test_server_sent_events_are_read_as_the_spec_says():
    async def events(raw: str):
        async def lines():
            for line in raw.split("\n"):
                yield line

        return [e async for e in _sse_events(lines())]

    raw = ': a comment\nevent: error\ndata: {"message": "x"}\n\ndata: a\ndata:b\nid: 3\n\ndata: [DONE]'
    assert asyncio.run(events(raw)) == [("error", '{"message": "x"}'), (None, "a\nb"), (None, "[DONE]")]


def test_an_endpoint_extra_body_is_sent_but_never_overrides_the_shared_fields(unseen_workload):
    bodies: list[dict] = []
    plain = contenders_for(table(0), {}, [])[0]
    items = load_workload(unseen_workload)[:1]
    extra = {"repeat_penalty": 1.0, "top_k": 0}
    with Served(make_app(plain, ByteCodec(), fault=lambda body: bodies.append(body) or None)) as s:
        results, _, _ = run_endpoint(
            Endpoint("e", s.url, extra_body=extra), items, SamplingParams(top_k=5), Load(), max_tokens=4, progress=False
        )
    assert results[0].ok and len(bodies) == 1
    assert bodies[0]["repeat_penalty"] == 1.0 and bodies[0]["top_k"] == 5  # the command line's top-k wins
    for field in ("max_tokens", "temperature", "model"):
        with pytest.raises(ConfigError, match=f"may not set {field}"):
            Endpoint("e", s.url, extra_body={field: 1})


def test_a_count_of_stream_chunks_takes_the_usage_count_of_an_identical_text_only():
    def result(config, prompt, text, tokens, source, error=None):
        stats = RequestStats(output_tokens=tokens, total_s=1.0, finish_reason="length")
        return RequestResult(prompt, "c", config, stats, text, None, error=error, token_count_source=source)

    results = [
        result("spekula", "a", "same text", 9, "usage"),
        result("llama", "a", "same text", 7, "chunks"),  # a character split over tokens: fewer chunks
        result("spekula", "b", "one text", 9, "usage"),
        result("llama", "b", "another text", 7, "chunks"),
        result("llama", "c", "same text", 7, "chunks"),  # another prompt: not the same tokens
    ]
    assert borrow_token_counts(results) == 1
    assert (results[1].stats.output_tokens, results[1].token_count_source) == (9, "usage (identical text)")
    assert [r.stats.output_tokens for r in results[3:]] == [7, 7]
    assert {r.token_count_source for r in results[3:]} == {"chunks"}


def test_a_server_that_counts_its_end_token_counts_an_identical_text_as_the_other_does():
    def result(config, prompt, text, tokens):
        stats = RequestStats(output_tokens=tokens, total_s=1.0, finish_reason="stop")
        return RequestResult(prompt, "c", config, stats, text, None, token_count_source="usage")

    results = [
        result("spekula", "a", "same text", 9),
        result("llama-server", "a", "same text", 10),  # its usage counts the end token it sampled
        result("spekula", "b", "one text", 9),
        result("llama-server", "b", "another text", 10),  # other texts: nothing to reconcile
    ]
    assert borrow_token_counts(results) == 1
    assert [r.stats.output_tokens for r in results] == [9, 9, 9, 10]
    assert [r.token_count_source for r in results] == ["usage", "usage (identical text)", "usage", "usage"]


@pytest.mark.parametrize("waves", [False, True])
def test_waves_send_the_same_batches_in_the_same_order_and_closed_loop_refills_at_once(
    waves, unseen_workload, monkeypatch
):
    """--waves: a wave of --concurrency requests starts only once the last wave's are all in, and within a wave a
    request is sent only once the server has queued the one before; the default closed loop sends them together and
    starts a request as soon as one ends. Request durations differ (scheduler yields, no clock)."""
    import spekula.bench.endpoint as endpoint_module

    events: list[tuple[str, int]] = []
    items = load_workload(unseen_workload)

    async def fake_request(client, model, item, sampling, max_tokens, chat, extra_body=None, queued=None):
        i = sum(e[0] == "start" for e in events)
        events.append(("start", i))
        for _ in range(3):  # the server takes its time to answer the headers
            await asyncio.sleep(0)
        events.append(("queued", i))
        queued.set()
        for _ in range(50 if i % 3 == 0 else 1):  # every third request takes longer
            await asyncio.sleep(0)
        events.append(("end", i))
        return RequestResult(item.id, item.category, "", RequestStats(finish_reason="length"), "x", None)

    monkeypatch.setattr(endpoint_module, "_request", fake_request)
    load = Load(concurrency=3, requests=9, waves=waves)
    endpoint = Endpoint("e", "http://127.0.0.1:9", model="m")
    results, _, _ = run_endpoint(endpoint, items, SamplingParams(), load, progress=False)
    assert len(results) == 9 and [r.order for r in results] == list(range(9))
    starts = [n for n, e in enumerate(events) if e[0] == "start"]
    ended_before = [sum(e[0] == "end" for e in events[:n]) for n in starts]
    queued_before = [sum(e[0] == "queued" for e in events[:n]) for n in starts]
    if waves:
        assert [ended_before[i] >= 3 * (i // 3) for i in range(9)] == [True] * 9, events  # the last wave all in
        assert ended_before[3] == 3 and ended_before[6] == 6, events  # a wave starts once the one before has all ended
        assert queued_before == [0, 1, 2, 3, 4, 5, 6, 7, 8], events  # each once the one before was queued
    else:
        assert queued_before[:3] == [0, 0, 0], events  # sent together
        assert ended_before[3] < 3, events  # refilled while the long first request was still in flight
