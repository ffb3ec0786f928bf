"""scripts/soak.py against the real server app over an in-memory model (no weights), on loopback, for a
second or two: a clean run passes; each way a server can fail (a 500, a request never answered, a cut
stream, a greedy text that changed) is counted as that outcome for every request it hit and fails the run.

Faults come from an ASGI wrapper around the app, armed only after the script's reference run (one chat
probe and one request per greedy prompt), so the reference itself is always the server's true answer.
"""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest

from spekula.server.app import create_app
from spekula.server.background import serving
from spekula.server.settings import ServerSettings

from pipelinekit import fake_pipeline
from scriptkit import loaded


@pytest.fixture(scope="module")
def soak():
    with loaded("soak.py") as module:
        yield module


class Faulty:
    """Passes requests through until armed; then every POST to /v1/completions meets `mode`:
    500 (an error status), hang (never answered), cut (a 200 stream of one event, then the end),
    swap (the prompt is changed on its way in, so a greedy text differs from its reference),
    429 (queue full, with Retry-After: 0), 429-bare (the same without Retry-After)."""

    def __init__(self, app) -> None:
        self.app = app
        self.mode: str | None = None
        self.after = 0  # completions POSTs let through before the fault starts
        self.seen = 0

    def arm(self, mode: str | None, after: int) -> None:
        self.mode, self.after, self.seen = mode, after, 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/completions" or self.mode is None:
            return await self.app(scope, receive, send)
        self.seen += 1
        if self.seen <= self.after:
            return await self.app(scope, receive, send)
        if self.mode == "swap":

            async def swapped():
                message = await receive()
                if message["type"] == "http.request" and message.get("body", b"").endswith(b'"}'):
                    message = dict(message, body=message["body"][:-2] + b' zq"}')  # the prompt is the last field
                return message

            return await self.app(scope, swapped, send)
        if self.mode == "hang":
            await asyncio.Event().wait()  # cancelled when the server shuts down
        status = {"500": 500, "cut": 200}.get(self.mode, 429)
        body = b'{"error": {"message": "boom", "type": "server_error", "param": null, "code": null}}'
        if self.mode == "cut":
            body = b'data: {"choices": [{"index": 0, "text": "a", "finish_reason": null}]}\n\n'
        headers = [(b"content-type", b"text/plain")] + [(b"retry-after", b"0")] * (self.mode == "429")
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


@pytest.fixture(scope="module")
def server(one_torch_thread):
    wrapper = Faulty(create_app(fake_pipeline(draft="other", k=4), ServerSettings()))
    with serving(wrapper, shutdown_timeout=1) as running:
        running.faults = wrapper
        yield running


def run(soak, server, mode=None, **kw):
    server.faults.arm(mode, after=len(soak.GREEDY_PROMPTS))
    options = dict(pid=None, clients=4, duration_s=1.0, warmup_s=0.2, deadline_s=30.0, seed=0, weights={"greedy": 1})
    return asyncio.run(soak.soak(server.url, **{**options, **kw}))


def test_a_clean_run_of_every_kind_passes_with_every_count_accounted_for(soak, server):
    s = run(soak, server, clients=6, duration_s=2.0, weights=None, pid=os.getpid(), max_rss_growth=100.0)
    # RSS is this test process's (the server runs in a thread here), hence the loose growth limit
    assert all(s["rss_mb"][k] > 0 for k in ("start", "warm", "end", "max"))
    assert s["passed"], json.dumps(s["targets"]) + json.dumps(s["examples"])
    requests = s["requests"]
    assert requests["sent"] == sum(requests[o] for o in soak.OUTCOMES) >= 6
    assert requests["sent"] == sum(sum(by.values()) for by in s["by_kind"].values())
    assert {o for kind in ("bad", "long") for o in s["by_kind"][kind]} <= {"4xx"}  # the server refuses each
    assert sum(sum(c.values()) for c in s["bad_inputs"].values()) == sum(s["by_kind"]["bad"].values())
    assert s["greedy"]["checked"] == s["by_kind"]["greedy"]["ok"] > 0 and s["greedy"]["mismatches"] == 0
    assert s["chat"] and s["context"] == 512 and s["model"] == "fake-bytes"
    assert all(t["met"] for t in s["targets"].values())


@pytest.mark.parametrize(
    "mode,outcome,target",
    [("500", "5xx", "5xx"), ("hang", "lost", "lost"), ("cut", "broken", "broken"), ("swap", "ok", "greedy_mismatches")],
)
def test_each_fault_is_counted_for_every_request_it_hits_and_fails_the_run(soak, server, mode, outcome, target):
    s = run(soak, server, mode, deadline_s=0.5 if mode == "hang" else 30.0)
    sent = s["requests"]["sent"]
    assert sent >= 4 and s["requests"][outcome] == s["by_kind"]["greedy"][outcome] == sent
    if mode == "swap":
        assert s["greedy"]["checked"] == s["greedy"]["mismatches"] == sent
        assert sum(s["greedy"]["mismatched_prompts"].values()) == sent
        assert 1 <= len(s["examples"]["greedy:mismatch"]) <= 3
    else:
        assert s["greedy"]["checked"] == 0 and 1 <= len(s["examples"][f"greedy:{outcome}"]) <= 3
    assert s["targets"][target] == {"value": sent, "limit": 0, "met": False}
    assert not s["passed"]


@pytest.mark.parametrize("retry_after", [True, False])
def test_a_429_is_its_own_column_and_a_failure_only_without_retry_after(soak, server, retry_after):
    s = run(soak, server, "429" if retry_after else "429-bare")
    assert s["requests"]["429"] == s["requests"]["sent"] >= 4 and s["requests"]["4xx"] == 0
    assert s["targets"]["429_without_retry_after"]["value"] == (0 if retry_after else s["requests"]["sent"])
    assert s["passed"] is retry_after


def test_every_bad_input_of_the_script_is_a_4xx_from_the_server(soak, server):
    server.faults.arm(None, after=0)
    for name, (path, make) in soak.BAD_INPUTS.items():
        r = httpx.post(f"{server.url}/v1/{path}", content=make("fake-bytes"), timeout=30)
        assert 400 <= r.status_code < 500 and r.status_code != 429, (name, r.status_code, r.text[:200])
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_the_command_line_exits_1_on_a_missed_target_and_writes_the_summary(soak, server, tmp_path, capsys):
    server.faults.arm("500", after=len(soak.GREEDY_PROMPTS))
    out = tmp_path / "summary.json"
    argv = ["--url", server.url + "/v1", "--clients", "2", "--duration", "0.5", "--warmup", "0.1"]
    assert soak.main([*argv, "--mix", "greedy=1", "--deadline", "30", "--json", str(out)]) == 1
    s = json.loads(out.read_text())
    assert s["requests"]["5xx"] == s["requests"]["sent"] > 0 and s["command"].startswith("--url")
    printed = capsys.readouterr()
    assert json.loads(printed.out.splitlines()[-1]) == s and "MISS 5xx" in printed.err and "FAILED" in printed.err


def test_no_server_is_a_setup_failure_exit_2(soak, capsys):
    assert soak.main(["--url", "http://127.0.0.1:9", "--duration", "1", "--warmup", "0"]) == 2
    assert "no server at http://127.0.0.1:9" in capsys.readouterr().err


def test_rss_growth_is_measured_from_the_warm_up_and_a_429_needs_retry_after(soak):
    plan = soak.Plan("http://x", "m", 64, False, {}, {})
    tally = soak.Tally()
    tally.add("sampled", "429")
    tally.no_retry_after = 1
    rss = {"start": 50.0, "warm": 100.0, "end": 106.0, "max": 106.0}
    s = soak.summarize(plan, tally, rss, 0, 1, 10.0, 1.0, 5.0, 10.0, max_rss_growth=5.0)
    assert s["rss_growth_pct"] == 6.0 and s["targets"]["rss_growth_pct"]["met"] is False
    assert s["requests"]["429"] == 1 and s["targets"]["429_without_retry_after"]["met"] is False
    rss["end"] = 104.0
    s = soak.summarize(plan, soak.Tally(), rss, None, 1, 10.0, 1.0, 5.0, 10.0, max_rss_growth=5.0)
    assert s["passed"] and s["targets"]["rss_growth_pct"]["met"] and s["targets"]["busy_after_drain"]["met"] is None


def test_mix_option(soak):
    assert soak.mix_option("greedy=1,bad=0.5") == {"greedy": 1.0, "bad": 0.5}
    for wrong in ("greedy=x", "nope=1", "greedy=0"):
        with pytest.raises(Exception, match="kind|number|weights"):
            soak.mix_option(wrong)
