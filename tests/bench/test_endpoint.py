"""Endpoint mode on loopback: two deployments of a tiny OpenAI-compatible server (plain and
speculative), measured side by side with the openai client; and the endpoint audit."""

from __future__ import annotations

import json

import pytest

from spekula.bench.endpoint import Endpoint, Load, normalise_url, run_endpoint
from spekula.bench.runner import SpecChoice
from spekula.bench.workloads import load_workload
from spekula.cli import main
from spekula.config import SamplingParams
from spekula.errors import ConfigError

from benchkit import ByteCodec, contenders_for, table
from fake_openai import Served, make_app


@pytest.fixture(scope="module")
def servers():
    """plain: the target alone; spec: the same target with a draft; other: a different target."""
    codec = ByteCodec()
    plain, spec = contenders_for(table(0), {"same": table(0)}, [SpecChoice("same", 3)])
    other = contenders_for(table(7), {}, [])[0]
    with Served(make_app(plain, codec)) as a, Served(make_app(spec, codec)) as b, Served(make_app(other, codec)) as c:
        yield {"plain": a.url, "spec": b.url, "other": c.url}


def last_json(capsys):
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1]), "\n".join(out)


def test_bench_two_endpoints_side_by_side(servers, unseen_workload, tmp_path, capsys):
    rc = main(["bench", "--endpoint", servers["spec"], "--baseline-endpoint", servers["plain"], "--workload", str(unseen_workload),
               "--concurrency", "2", "--requests", "6", "--max-tokens", "10", "--out", str(tmp_path / "out"), "--no-progress"])
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
    assert over["throughput_tokens_per_s"] > 0 and over["output_tokens"] == sum(r["stats"]["output_tokens"] for r in reqs if r["config"] == "endpoint")
    assert result["manifest"]["models"][0]["name"] == "fake-model" and result["manifest"]["config"]["load"]["concurrency"] == 2
    assert "data:image/png;base64," in open(line["report"]).read()


def test_time_limit_and_failures_are_bounded(servers, unseen_workload):
    items = load_workload(unseen_workload)
    results, wall, model = run_endpoint(Endpoint("e", servers["plain"]), items, SamplingParams(), Load(requests=50, time_limit_s=1e-6),
                                        max_tokens=4, progress=False)
    assert model == "fake-model" and len(results) < 50  # nothing starts after the time limit
    dead = Endpoint("dead", "http://127.0.0.1:9", model="m")  # nothing listens on the discard port
    results, _, _ = run_endpoint(dead, items, SamplingParams(), Load(requests=2, request_timeout_s=5), max_tokens=4, progress=False)
    assert len(results) == 2 and all(r.error for r in results)
    with pytest.raises(ConfigError, match="pass --model"):
        run_endpoint(Endpoint("dead", "http://127.0.0.1:9"), items, SamplingParams(), Load(request_timeout_s=5), progress=False)
    assert normalise_url("http://h:1/") == "http://h:1/v1" and normalise_url("http://h:1/v1") == "http://h:1/v1"


def test_audit_endpoints(servers, unseen_workload, tmp_path, capsys):
    args = ["audit", "--workload", str(unseen_workload), "--max-tokens", "10", "--no-progress"]
    rc = main(args + ["--endpoint", servers["spec"], "--baseline-endpoint", servers["plain"], "--out", str(tmp_path / "a")])
    line, text = last_json(capsys)
    assert rc == 0 and line["passed"] is True and "4/4 outputs identical" in text
    saved = json.loads(open(line["results"]).read())
    assert saved["passed"] and saved["manifest"]["models"][0]["url"] == servers["spec"]
    rc = main(args + ["--endpoint", servers["other"], "--baseline-endpoint", servers["plain"], "--out", str(tmp_path / "b")])
    line, text = last_json(capsys)
    assert rc == 1 and line["passed"] is False and "DIFFERENT" in text and "audit: FAIL" in text


def test_cli_refuses_half_an_endpoint_pair(unseen_workload, capsys):
    assert main(["audit", "--workload", str(unseen_workload), "--endpoint", "http://127.0.0.1:9"]) == 2
    assert "needs both --endpoint" in capsys.readouterr().err
    assert main(["bench", "--workload", str(unseen_workload), "--baseline-endpoint", "http://127.0.0.1:9"]) == 2
